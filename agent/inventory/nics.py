"""NICs from ``/sys/class/net`` and ``/sys/class/infiniband``.

Which interfaces are reported:

- every interface backed by a device (``/sys/class/net/X/device`` exists):
  physical NICs, virtio NICs, SR-IOV functions;
- a virtual interface (bond, bridge, veth in a namespace...) only when it is up
  and has an address that is not link-local: that keeps the testbed's veth NICs
  and a host's bond, and drops container plumbing (veth pairs, ifb, docker
  leftovers without addresses);
- an RDMA device without a net interface (no IPoIB), under its RDMA name;
- never the loopback.

The RDMA device of an interface is the one on the same PCI function. For
InfiniBand the speed and link state come from the RDMA port (``rate``,
``state``), as ``ibstat`` shows them; for Ethernet from the interface.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

from agent.inventory.paths import HostPaths, read_int, read_text
from agent.inventory.pcie import chain_of, numa_node_of

ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772
_DOWN_STATES = {"down", "lowerlayerdown", "notpresent", "dormant"}


def _link_local(address: str) -> bool:
    try:
        ip = ipaddress.ip_interface(address).ip
    except ValueError:
        return False
    return ip.is_link_local or ip.is_loopback


def format_guid(node_guid: str | None) -> str:
    """sysfs ``946d:ae03:007a:1b2c`` -> ``0x946dae03007a1b2c``."""
    if not node_guid:
        return ""
    digits = node_guid.replace(":", "").lower()
    return f"0x{digits}" if re.fullmatch(r"[0-9a-f]{16}", digits) else ""


def parse_rate_mbps(rate: str | None) -> int | None:
    """``400 Gb/sec (4X NDR)`` -> 400000."""
    if not rate:
        return None
    match = re.match(r"^\s*([\d.]+)\s*([GM])b/sec", rate)
    if not match:
        return None
    value = float(match.group(1)) * (1000 if match.group(2) == "G" else 1)
    return int(round(value))


def _rdma_devices(paths: HostPaths) -> tuple[dict[str, dict], list[dict]]:
    """RDMA devices by the real path of their PCI function, and the full list."""
    by_function: dict[str, dict] = {}
    devices: list[dict] = []
    ib_dir = paths.sys / "class" / "infiniband"
    try:
        entries = sorted(ib_dir.iterdir(), key=lambda p: p.name)
    except OSError:
        return by_function, devices
    for dev in entries:
        ports_dir = dev / "ports"
        try:
            ports = sorted((p for p in ports_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        except OSError:
            ports = []
        port = ports[0] if ports else None
        state = read_text(port / "state") if port else None  # "4: ACTIVE"
        state_name = state.split(":", 1)[-1].strip().upper() if state else ""
        info = {
            "name": dev.name,
            "guid": format_guid(read_text(dev / "node_guid")),
            "rate_mbps": parse_rate_mbps(read_text(port / "rate")) if port else None,
            "link_layer": (read_text(port / "link_layer") or "") if port else "",
            "link_state": "up" if state_name == "ACTIVE" else ("down" if state_name else "unknown"),
            "device_path": dev / "device",
        }
        devices.append(info)
        if (dev / "device").exists():
            by_function[os.path.realpath(dev / "device")] = info
    return by_function, devices


def _link_state(ifdir: Path) -> str:
    operstate = (read_text(ifdir / "operstate") or "").lower()
    if operstate == "up":
        return "up"
    if operstate in _DOWN_STATES:
        return "down"
    carrier = read_int(ifdir / "carrier")
    if carrier == 1:
        return "up"
    if carrier == 0:
        return "down"
    return "unknown"


def collect_nics(paths: HostPaths, addresses: dict[str, list[str]]) -> tuple[list[dict], list[str]]:
    errors: list[str] = []
    rdma_by_function, rdma_all = _rdma_devices(paths)
    used_rdma: set[str] = set()
    nics: list[dict] = []
    net_dir = paths.sys / "class" / "net"
    try:
        interfaces = sorted(net_dir.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        return [], [f"nics: {net_dir} cannot be listed: {exc}"]
    for ifdir in interfaces:
        name = ifdir.name
        if_type = read_int(ifdir / "type")
        if name == "lo" or if_type == ARPHRD_LOOPBACK:
            continue
        addrs = list(addresses.get(name, []))
        device_link = ifdir / "device"
        backed = device_link.exists()
        link_state = _link_state(ifdir)
        if not backed and (link_state == "down" or all(_link_local(a) for a in addrs)):
            continue
        chain = chain_of(paths, device_link) if backed else None
        pci = chain[-1] if chain else ""
        rdma = rdma_by_function.get(os.path.realpath(device_link)) if backed else None
        if rdma is not None:
            used_rdma.add(rdma["name"])
        kind = "infiniband" if if_type == ARPHRD_INFINIBAND else "ethernet"
        speed = read_int(ifdir / "speed")
        speed = speed if speed is not None and speed > 0 else None
        if rdma is not None and rdma["link_state"] == "up" and (kind == "infiniband" or speed is None):
            speed = rdma["rate_mbps"] or speed  # the port's rate, as ibstat shows it
        if kind == "infiniband" and rdma is not None and link_state != "down":
            link_state = rdma["link_state"]
        nics.append(
            {
                "device": name,
                "kind": kind,
                "mac": (read_text(ifdir / "address") or "") if kind == "ethernet" else "",
                "guid": rdma["guid"] if rdma else "",
                "rdma_device": rdma["name"] if rdma else "",
                "pci_address": pci,
                "numa_node": numa_node_of(paths, pci) if pci else None,
                "speed_mbps": speed,
                "mtu": read_int(ifdir / "mtu"),
                "link_state": link_state,
                "addresses": addrs,
            }
        )
    for rdma in rdma_all:
        if rdma["name"] in used_rdma:
            continue
        chain = chain_of(paths, rdma["device_path"]) if rdma["device_path"].exists() else None
        pci = chain[-1] if chain else ""
        nics.append(
            {
                "device": rdma["name"],
                "kind": "infiniband" if rdma["link_layer"].lower() != "ethernet" else "ethernet",
                "mac": "",
                "guid": rdma["guid"],
                "rdma_device": rdma["name"],
                "pci_address": pci,
                "numa_node": numa_node_of(paths, pci) if pci else None,
                "speed_mbps": rdma["rate_mbps"] if rdma["link_state"] == "up" else None,
                "mtu": None,
                "link_state": rdma["link_state"],
                "addresses": [],
            }
        )
    nics.sort(key=lambda n: n["device"])
    return nics, errors
