#!/usr/bin/env python3
"""Write the recorded host trees under tests/agent/data/ from the layouts below.

    python tests/agent/data/build_trees.py            # rewrite the trees in place
    python tests/agent/data/build_trees.py --out DIR  # write them elsewhere (the tests compare)

Each tree holds only what the agent reads: ``sys/`` (PCI device paths with
``numa_node`` and link speed/width, ``bus/pci/devices`` links, bridge config spaces
up to their ACS capability, ``class/net`` and ``class/infiniband`` links and
attributes), ``proc/`` and ``etc/`` host facts, and ``ip-addr.json`` (``ip -j addr``
output); for the audit also ``dmesg.txt`` (kernel log), ``adjtimex.json`` (kernel
clock state), ``ethtool.json`` (``ethtool -i`` per interface) and ``usr/`` (the NCCL
library, ``/usr/local/cuda/version.json``). Where every fact comes from: README.md
beside this file.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------------------
# Layouts. A PCI path is the list of components under /sys/devices.


def rail_pair_pxb(nic_bus: int) -> tuple[list[str], list[str]]:
    """DGX H100: CPU root port -> ConnectX-7 (integrated PCIe switch) -> NIC, and -> a second
    switch level -> GPU. nvidia-smi reports the pair as PXB; GPU bus = NIC bus + 3."""
    hb = nic_bus - 3
    rp = f"0000:{hb:02x}:01.0"
    usp = f"0000:{hb + 1:02x}:00.0"
    nic_path = [f"pci0000:{hb:02x}", rp, usp, f"0000:{hb + 2:02x}:00.0", f"0000:{nic_bus:02x}:00.0"]
    gpu_path = [
        f"pci0000:{hb:02x}", rp, usp, f"0000:{hb + 2:02x}:01.0",
        f"0000:{nic_bus + 1:02x}:00.0", f"0000:{nic_bus + 2:02x}:00.0", f"0000:{nic_bus + 3:02x}:00.0",
    ]
    return nic_path, gpu_path


def rail_pair_pix(hb: int, gpu_bus: int, nic_bus: int) -> tuple[list[str], list[str]]:
    """HGX H100 (Broadcom PEX switch per pair): root port -> switch up -> two down ports ->
    GPU and NIC. nvidia-smi reports the pair as PIX."""
    rp = f"0000:{hb:02x}:01.0"
    usp = f"0000:{hb + 1:02x}:00.0"
    first, second = sorted([gpu_bus, nic_bus])
    down = {first: f"0000:{hb + 2:02x}:00.0", second: f"0000:{hb + 2:02x}:01.0"}
    nic_path = [f"pci0000:{hb:02x}", rp, usp, down[nic_bus], f"0000:{nic_bus:02x}:00.0"]
    gpu_path = [f"pci0000:{hb:02x}", rp, usp, down[gpu_bus], f"0000:{gpu_bus:02x}:00.0"]
    return nic_path, gpu_path


def direct(hb: int, bus: int, function: int) -> list[str]:
    """A NIC right below a CPU root port (dual-port cards: functions .0 and .1)."""
    return [f"pci0000:{hb:02x}", f"0000:{hb:02x}:01.0", f"0000:{bus:02x}:00.{function}"]


def ib_address(guid: str) -> str:
    """IPoIB hardware address: 4 bytes of QPN/flags, then the port GID fe80::<guid>."""
    g = guid.replace(":", "")
    octets = ["00", "00", "10", "29", "fe", "80"] + ["00"] * 6 + [g[i : i + 2] for i in range(0, 16, 2)]
    return ":".join(octets)


def guid_for(n: int, prefix: str = "946d:ae03:00f8") -> str:
    return f"{prefix}:{0x1a00 + n * 0x10:04x}"


def dgx_h100() -> dict:
    compute = [  # (ConnectX-7 bus, netdev, rdma, numa) — DGX H100 User Guide, Table 6 / ibdev2netdev
        (0x18, "ibp24s0", "mlx5_0", 0),
        (0x40, "ibp64s0", "mlx5_3", 0),
        (0x4F, "ibp79s0", "mlx5_4", 0),
        (0x5E, "ibp94s0", "mlx5_5", 0),
        (0x9A, "ibp154s0", "mlx5_6", 1),
        (0xC0, "ibp192s0", "mlx5_9", 1),
        (0xCE, "ibp206s0", "mlx5_10", 1),
        (0xDC, "ibp220s0", "mlx5_11", 1),
    ]
    gpus, nics = [], []
    for i, (bus, netdev, rdma, numa) in enumerate(compute):
        nic_path, gpu_path = rail_pair_pxb(bus)
        gpus.append({"path": gpu_path, "numa": numa})
        guid = guid_for(i)
        nics.append({
            "path": nic_path, "numa": numa, "netdev": netdev, "type": 32, "address": ib_address(guid),
            "mtu": 4092, "operstate": "up", "speed": None, "rdma": rdma, "guid": guid,
            "port_state": "4: ACTIVE", "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand",
        })
    storage = [  # dual-port storage ConnectX-7: port 1 InfiniBand, port 2 Ethernet
        (0x28, 0x29, 0, "ibp41s0f0", "mlx5_1", 0, "up"),
        (0x28, 0x29, 1, "enp41s0f1np1", "mlx5_2", 0, "down"),
        (0xA9, 0xAA, 0, "ibp170s0f0", "mlx5_7", 1, "down"),
        (0xA9, 0xAA, 1, "enp170s0f1np1", "mlx5_8", 1, "down"),
    ]
    for j, (hb, bus, fn, netdev, rdma, numa, state) in enumerate(storage):
        guid = guid_for(8 + j, "946d:ae03:00f9")
        ib = netdev.startswith("ib")
        nics.append({
            "path": direct(hb, bus, fn), "numa": numa, "netdev": netdev, "type": 32 if ib else 1,
            "address": ib_address(guid) if ib else f"94:6d:ae:f9:1a:{0x80 + j:02x}",
            "mtu": 4092 if ib else 1500, "operstate": state, "speed": None if ib or state == "down" else 400000,
            "rdma": rdma, "guid": guid, "port_state": "4: ACTIVE" if state == "up" else "1: DOWN",
            "rate": "400 Gb/sec (4X NDR)" if state == "up" else "10 Gb/sec (4X SDR)",
            "link_layer": "InfiniBand" if ib else "Ethernet",
        })
    addrs = {n["netdev"]: [f"192.168.{10 + i}.21/24"] for i, n in enumerate(nics[:8])}
    addrs["ibp41s0f0"] = ["172.16.40.21/16"]
    return {
        "name": "dgx-h100",
        "gpus": gpus,
        "nics": nics,
        "virtual": [
            {"netdev": "docker0", "address": "02:42:5c:11:0a:01", "mtu": 1500, "operstate": "up", "type": 1},
            {"netdev": "veth3f2a1b0", "address": "6a:1e:44:90:12:7c", "mtu": 1500, "operstate": "up", "type": 1},
        ],
        "addresses": {**addrs, "docker0": ["172.17.0.1/16"], "veth3f2a1b0": ["fe80::681e:44ff:fe90:127c/64"]},
        "host": {
            "hostname": "dgx-h100-01",
            "machine_id": "8c2d1f4e9b7a46c1a0f35e2b7d9c4a18",
            "boot_id": "6b0d5c8e-2f4a-4e1b-9a7c-3d5e8f1a2b4c",
            "osrelease": "5.15.0-1042-nvidia",
            "arch": "x86_64",
            "os_pretty": "Ubuntu 22.04.4 LTS",
            "cpu_model": "Intel(R) Xeon(R) Platinum 8480C",
            "cpus": 224,
            "mem_kb": 2113389124,
        },
        "audit": {
            "driver": "mlx5_core", "driver_version": "24.10-1.1.4", "firmware": "28.39.1002 (MT_0000000838)",
            "nccl": "2.21.5", "cuda_toolkit": "12.4.1", "dmesg": [], "adjtimex": _SYNCED_CLOCK,
            "hugepages": 0, "thp": "madvise",
        },
    }


# adjtimex(2) of a chrony-synchronized host: TIME_OK, STA_PLL|STA_NANO (0x2001), errors in µs
_SYNCED_CLOCK = {"state": 0, "status": 8193, "maxerror_us": 1125, "esterror_us": 12, "synchronized": True}


def hgx_h100() -> dict:
    rails = [  # (host bridge, GPU bus, NIC bus, netdev, rdma, numa)
        (0x15, 0x18, 0x19, "enp25s0np0", "mlx5_0", 0),  # recorded: NCCL pciPath of mlx5_0, ubuntu-drivers GPU path
        (0x26, 0x2A, 0x29, "enp41s0np0", "mlx5_1", 0),
        (0x37, 0x3A, 0x3B, "enp59s0np0", "mlx5_2", 0),  # recorded: NCCL pciPath of mlx5_2
        (0x59, 0x5D, 0x5C, "enp92s0np0", "mlx5_5", 0),  # recorded: NCCL pciPath of mlx5_5
        (0x97, 0x9A, 0x9B, "enp155s0np0", "mlx5_6", 1),
        (0xA7, 0xAB, 0xAA, "enp170s0np0", "mlx5_7", 1),
        (0xB7, 0xBA, 0xBB, "enp187s0np0", "mlx5_8", 1),
        (0xD7, 0xDB, 0xDA, "enp218s0np0", "mlx5_11", 1),
    ]
    gpus, nics = [], []
    for i, (hb, gbus, nbus, netdev, rdma, numa) in enumerate(rails):
        nic_path, gpu_path = rail_pair_pix(hb, gbus, nbus)
        gpus.append({"path": gpu_path, "numa": numa})
        guid = guid_for(i, "a088:c203:0047")
        nics.append({
            "path": nic_path, "numa": numa, "netdev": netdev, "type": 1,
            "address": f"a0:88:c2:47:{0x1a + i:02x}:{0x00 + i:02x}", "mtu": 4200, "operstate": "up",
            "speed": 400000, "rdma": rdma, "guid": guid, "port_state": "4: ACTIVE",
            "rate": "400 Gb/sec (4X NDR)", "link_layer": "Ethernet",
        })
    frontend = [  # dual-port ConnectX-7 frontend cards (mlx5_3/4 on NUMA 0, mlx5_9/10 on NUMA 1)
        (0x48, 0x49, 0, "enp73s0f0np0", "mlx5_3", 0, "up"),
        (0x48, 0x49, 1, "enp73s0f1np1", "mlx5_4", 0, "down"),
        (0xC7, 0xC8, 0, "enp200s0f0np0", "mlx5_9", 1, "down"),
        (0xC7, 0xC8, 1, "enp200s0f1np1", "mlx5_10", 1, "down"),
    ]
    for j, (hb, bus, fn, netdev, rdma, numa, state) in enumerate(frontend):
        guid = guid_for(8 + j, "a088:c203:0048")
        nics.append({
            "path": direct(hb, bus, fn), "numa": numa, "netdev": netdev, "type": 1,
            "address": f"a0:88:c2:48:{0x1a + j:02x}:{0x10 + j:02x}", "mtu": 1500, "operstate": state,
            "speed": 200000 if state == "up" else None, "rdma": rdma, "guid": guid,
            "port_state": "4: ACTIVE" if state == "up" else "1: DOWN",
            "rate": "200 Gb/sec (4X HDR)" if state == "up" else "40 Gb/sec (4X QDR)", "link_layer": "Ethernet",
        })
    addrs = {n["netdev"]: [f"10.99.{91 + i}.59/24"] for i, n in enumerate(nics[:8])}
    addrs["enp73s0f0np0"] = ["10.20.0.59/16", "fe80::a288:c2ff:fe48:1a10/64"]
    return {
        "name": "hgx-h100",
        "gpus": gpus,
        "nics": nics,
        "virtual": [
            {"netdev": "bond0", "address": "a0:88:c2:48:1a:10", "mtu": 1500, "operstate": "down", "type": 1},
        ],
        "addresses": addrs,
        "host": {
            "hostname": "gpu-node-0007",
            "machine_id": "1f6e3a9c4b2d48e7a5c0d9b8e7f6a5b4",
            "boot_id": "d3c2b1a0-9f8e-4d7c-8b6a-5f4e3d2c1b0a",
            "osrelease": "5.14.0-427.42.1.el9_4.x86_64",
            "arch": "x86_64",
            "os_pretty": "Red Hat Enterprise Linux 9.4 (Plow)",
            "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
            "cpus": 224,
            "mem_kb": 2113389124,
        },
        "audit": {
            "driver": "mlx5_core", "driver_version": "5.14.0-427.42.1.el9_4.x86_64",
            "firmware": "28.42.1000 (MT_0000000838)", "nccl": "2.23.4", "cuda_toolkit": "12.6.2", "dmesg": [],
            "adjtimex": _SYNCED_CLOCK, "hugepages": 0, "thp": "always",
        },
    }


def hgx_h100_defects() -> dict:
    """The HGX H100 with PCIe, NIC, kernel-log and clock defects (its GPU defects come from
    FakeNvml.hgx_h100_defects(): ECC, pending remap, Gen4 x8, Xid 74, thermal throttle on GPUs 1-5)."""
    spec = copy.deepcopy(hgx_h100())
    spec["name"] = "hgx-h100-defects"
    nics = {n["netdev"]: n for n in spec["nics"]}
    nics["enp92s0np0"]["link"] = {"current": (4, 8), "max": (5, 16)}  # rail 3 NIC trained at Gen4 x8
    nics["enp218s0np0"]["mtu"] = 1500  # rail 7 NIC left at the default MTU (fabric: 4200)
    nics["enp41s0np0"]["counters"] = {"link_downed": 3, "symbol_error": 41}  # rail 1: flapping, bit errors
    nics["enp41s0np0"]["carrier_changes"] = 8
    nics["enp59s0np0"]["firmware"] = "28.39.1002 (MT_0000000838)"  # rail 2: older firmware than the rest
    spec["acs"] = {"0000:b9:00.0": 0x001D}  # rail 6 switch port: SrcValid ReqRedir CmpltRedir UpstreamFwd
    spec["audit"] = dict(spec["audit"], nccl="2.19.3", adjtimex={
        "state": 5, "status": 0x0041, "maxerror_us": 16000000, "esterror_us": 16000000, "synchronized": False},
        dmesg=[
            "[ 8123.551204] NVRM: Xid (PCI:0000:9a:00): 74, pid=51244, name=python3, NVLink: fatal error detected "
            "on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            "[ 9011.004512] NVRM: Xid (PCI:0000:ba:00): 13, pid=53990, name=python3, Graphics Exception: "
            "ESR 0x514648=0x1000000e 0x514650=0x0 0x514644=0xd3eff2 0x51464c=0x17f",
        ])
    return spec


# --------------------------------------------------------------------------------------
# Writer.


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(target, link.parent)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(rel)


def write_tree(spec: dict, out: Path) -> Path:
    root = out / spec["name"]
    if root.exists():
        shutil.rmtree(root)
    sysd = root / "sys"
    devices = sysd / "devices"

    acs = spec.get("acs", {})
    bridges_done: set[str] = set()

    def bridges(path: list[str]) -> None:
        """Root port and PCIe switch ports above a device: links, and config space up to ACS."""
        for i in range(1, len(path) - 1):
            bdf = path[i]
            if bdf in bridges_done:
                continue
            bridges_done.add(bdf)
            d = devices.joinpath(*path[: i + 1])
            _link(sysd / "bus" / "pci" / "devices" / bdf, d)
            _pci_link_files(d, (5, 16), (5, 16))
            if i >= 2:  # switch ports carry an ACS capability
                (d / "config").write_bytes(_config_space(acs.get(bdf, 0)))

    def pci_dev(path: list[str], numa: int, link: dict | None = None) -> Path:
        d = devices.joinpath(*path)
        _write(d / "numa_node", str(numa))
        _link(sysd / "bus" / "pci" / "devices" / path[-1], d)
        link = link or {}
        _pci_link_files(d, link.get("current", (5, 16)), link.get("max", (5, 16)))
        for name, total in (("aer_dev_correctable", "TOTAL_ERR_COR"), ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
                            ("aer_dev_fatal", "TOTAL_ERR_FATAL")):
            _write(d / name, f"{total} 0")
        bridges(path)
        return d

    audit = spec["audit"]
    driver_dir = sysd / "bus" / "pci" / "drivers" / audit["driver"]
    # sysfs driver directories hold `bind`, `unbind`, `uevent`...: one such file keeps the directory
    # (a symlink target) in git, which does not store empty directories.
    _write(driver_dir / "uevent", "")
    ethtool = {}
    for gpu in spec["gpus"]:
        pci_dev(gpu["path"], gpu["numa"])
    for nic in spec["nics"]:
        d = pci_dev(nic["path"], nic["numa"], nic.get("link"))
        _link(d / "driver", driver_dir)
        firmware = nic.get("firmware", audit["firmware"])
        ethtool[nic["netdev"]] = {"driver": audit["driver"], "version": audit["driver_version"], "firmware": firmware,
                                  "bus_info": nic["path"][-1]}
        net = d / "net" / nic["netdev"]
        _write(net / "type", str(nic["type"]))
        _write(net / "address", nic["address"])
        _write(net / "mtu", str(nic["mtu"]))
        _write(net / "operstate", nic["operstate"])
        if nic["operstate"] == "up":
            _write(net / "carrier", "1")
        if nic["speed"] is not None:
            _write(net / "speed", str(nic["speed"]))
        _write(net / "statistics" / "rx_errors", "0")
        _write(net / "statistics" / "tx_errors", "0")
        _write(net / "carrier_changes", str(nic.get("carrier_changes", 2 if nic["operstate"] == "up" else 1)))
        _link(net / "device", d)
        _link(sysd / "class" / "net" / nic["netdev"], net)
        ib = d / "infiniband" / nic["rdma"]
        _write(ib / "node_guid", nic["guid"])
        _write(ib / "fw_ver", firmware.split()[0])
        _write(ib / "ports" / "1" / "state", nic["port_state"])
        _write(ib / "ports" / "1" / "phys_state", "5: LinkUp" if nic["port_state"].endswith("ACTIVE") else "3: Disabled")
        _write(ib / "ports" / "1" / "rate", nic["rate"])
        _write(ib / "ports" / "1" / "link_layer", nic["link_layer"])
        counters = {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0}
        counters |= nic.get("counters", {})
        for key, value in counters.items():
            _write(ib / "ports" / "1" / "counters" / key, str(value))
        _link(ib / "device", d)
        _link(sysd / "class" / "infiniband" / nic["rdma"], ib)
    for v in [{"netdev": "lo", "address": "00:00:00:00:00:00", "mtu": 65536, "operstate": "unknown", "type": 772},
              *spec["virtual"]]:
        net = devices / "virtual" / "net" / v["netdev"]
        for key in ("type", "address", "mtu", "operstate"):
            _write(net / key, str(v[key]))
        _link(sysd / "class" / "net" / v["netdev"], net)

    host = spec["host"]
    proc = root / "proc"
    _write(proc / "sys" / "kernel" / "hostname", host["hostname"])
    _write(proc / "sys" / "kernel" / "osrelease", host["osrelease"])
    _write(proc / "sys" / "kernel" / "arch", host["arch"])
    _write(proc / "sys" / "kernel" / "random" / "boot_id", host["boot_id"])
    _write(proc / "cpuinfo", "\n\n".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: {host['cpu_model']}" for i in range(host["cpus"])
    ))
    _write(proc / "meminfo", f"MemTotal:       {host['mem_kb']} kB\nMemFree:        {host['mem_kb'] - 41943040} kB\n"
                             f"MemAvailable:   {host['mem_kb'] - 33554432} kB\n"
                             f"HugePages_Total:       {audit['hugepages']}\nHugepagesize:       2048 kB")
    _write(proc / "loadavg", "0.52 0.61 0.58 2/1873 412345")
    _write(proc / "uptime", "864123.45 190012345.67")
    _write(root / "etc" / "machine-id", host["machine_id"])
    _write(root / "etc" / "os-release", f'NAME="{host["os_pretty"].split()[0]}"\nPRETTY_NAME="{host["os_pretty"]}"')

    links = [{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                                             {"family": "inet6", "local": "::1", "prefixlen": 128}]}]
    for name, addresses in spec["addresses"].items():
        info = []
        for a in addresses:
            local, prefix = a.split("/")
            info.append({"family": "inet6" if ":" in local else "inet", "local": local, "prefixlen": int(prefix)})
        links.append({"ifname": name, "addr_info": info})
    _write(root / "ip-addr.json", json.dumps(links, indent=1))

    thp = " ".join(f"[{m}]" if m == audit["thp"] else m for m in ("always", "madvise", "never"))
    _write(sysd / "kernel" / "mm" / "transparent_hugepage" / "enabled", thp)
    _write(root / "dmesg.txt", "\n".join(audit["dmesg"]))
    _write(root / "adjtimex.json", json.dumps(audit["adjtimex"], sort_keys=True))
    _write(root / "ethtool.json", json.dumps(ethtool, indent=1, sort_keys=True))
    _write(root / "usr" / "lib" / "x86_64-linux-gnu" / f"libnccl.so.{audit['nccl']}", "")
    _link(root / "usr" / "lib" / "x86_64-linux-gnu" / "libnccl.so.2",
          root / "usr" / "lib" / "x86_64-linux-gnu" / f"libnccl.so.{audit['nccl']}")
    _write(root / "usr" / "local" / "cuda" / "version.json",
           json.dumps({"cuda": {"name": "CUDA SDK", "version": audit["cuda_toolkit"]}}))
    return root


_GTS = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}


def _pci_link_files(d: Path, current: tuple[int, int], maximum: tuple[int, int]) -> None:
    _write(d / "current_link_speed", _GTS[current[0]])
    _write(d / "current_link_width", str(current[1]))
    _write(d / "max_link_speed", _GTS[maximum[0]])
    _write(d / "max_link_width", str(maximum[1]))


def _config_space(acs_control: int) -> bytes:
    """A PCIe switch port's config space up to its ACS capability (what the audit reads).

    Extended capabilities from 0x100: AER (id 0x0001, v2) then ACS (id 0x000D, v1) at 0x148
    with capability 0x005F (SV TB RR CR UF EC... supported) and the given control register."""
    data = bytearray(0x150)
    struct.pack_into("<HH", data, 0, 0x1000, 0xC030)  # vendor/device: Broadcom PEX89000 switch port
    struct.pack_into("<I", data, 0x100, 0x0001 | (2 << 16) | (0x148 << 20))
    struct.pack_into("<IHH", data, 0x148, 0x000D | (1 << 16), 0x005F, acs_control)
    return bytes(data)


TREES = {"dgx-h100": dgx_h100, "hgx-h100": hgx_h100, "hgx-h100-defects": hgx_h100_defects}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    for build in TREES.values():
        print(write_tree(build(), args.out))


if __name__ == "__main__":
    main()
