"""PCIe tree from sysfs, and GPU↔NIC affinity as ``nvidia-smi topo -m`` reports it.

A PCI device's real sysfs path spells its place in the tree::

    /sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0
                 host bridge root port   switch up    switch down  endpoint

Its *chain* is the list of those components, host bridge first, device last.
Below the root port, bridges come in pairs: a switch's upstream port, then one
of its downstream ports (the same rule NCCL's topology code uses: "a switch is
two levels"). So the bridge at chain index ``i >= 2`` belongs to the switch
whose upstream port is at index ``2 + 2*((i-2)//2)``.

Relations (``nvidia-smi topo -m`` legend):

- ``PIX``: at most one PCIe switch between the two devices;
- ``PXB``: several switches, but no host bridge;
- ``PHB``: the path goes through the host bridge (same root complex);
- ``NODE``: different host bridges, same NUMA node;
- ``SYS``: different NUMA nodes (the SMP interconnect).

A NUMA node of -1 (unknown, single-node machines) counts as node 0.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from agent.inventory.paths import HostPaths, read_int

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's ``00000000:18:00.0`` (or ``0000:18:00.0``) as sysfs spells it: ``0000:18:00.0``."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode()
    text = bus_id.strip().lower()
    match = re.match(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$", text)
    if not match:
        return text
    domain = int(match.group(1), 16)
    return f"{domain:04x}:{match.group(2)}:{match.group(3)}.{match.group(4)}"


def chain_of(paths: HostPaths, device_path: Path) -> list[str] | None:
    """The PCI chain (host bridge .. nearest PCI function) of a sysfs device path.

    ``device_path`` may be a PCI function or a device below one (a virtio
    device, a net interface): the chain stops at the last PCI function above it.
    None when the device is not on a PCI bus (virtual interfaces).
    """
    try:
        real = Path(os.path.realpath(device_path))
        rel = real.relative_to(Path(os.path.realpath(paths.sys)) / "devices")
    except (OSError, ValueError):
        return None
    parts = rel.parts
    for start, part in enumerate(parts):
        if HOST_BRIDGE_RE.match(part):
            chain = [part]
            for comp in parts[start + 1 :]:
                if not BDF_RE.match(comp):
                    break
                chain.append(comp)
            return chain if len(chain) >= 2 else None
    return None


def pci_device_dir(paths: HostPaths, bdf: str) -> Path:
    return paths.sys / "bus" / "pci" / "devices" / bdf


def numa_node_of(paths: HostPaths, bdf: str) -> int | None:
    """NUMA node of a PCI function; None when unknown (sysfs says -1 or nothing)."""
    value = read_int(pci_device_dir(paths, bdf) / "numa_node")
    return value if value is not None and value >= 0 else None


def _switch_of(chain: list[str], index: int) -> str:
    return chain[2 + 2 * ((index - 2) // 2)]


def relation(a: list[str], numa_a: int | None, b: list[str], numa_b: int | None) -> str:
    """``PIX``/``PXB``/``PHB``/``NODE``/``SYS`` between two devices given their chains."""
    if a[0] != b[0]:
        return "NODE" if (numa_a or 0) == (numa_b or 0) else "SYS"
    common = 0
    for x, y in zip(a[:-1], b[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common <= 1:
        return "PHB"
    lca = common - 1
    if lca == 1:
        return "PIX"  # functions of one device right under the root port
    switches = {_switch_of(a, lca)}
    for chain in (a, b):
        for index in range(common, len(chain) - 1):
            switches.add(_switch_of(chain, index))
    return "PIX" if len(switches) <= 1 else "PXB"
