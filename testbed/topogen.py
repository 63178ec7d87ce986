"""Two-tier rail-optimized topologies for the emulator: a thin front to the one generator in
`testbed.simulate.topology`, with the parameter names the emulator's API and CLI use.

Naming follows the shared scenarios: hosts `node0000`, NICs `node0000/nic0` (NIC k on rail k),
leaves `leaf-su00-r0`, spines `spine-p0-00`, access links `node0000/nic0~leaf-su00-r0` and
leaf-spine links `leaf-su00-r0~spine-p0-00#0` (`#k` numbers parallel links).
"""

from __future__ import annotations

from typing import Any

from testbed.simulate.topology import TopoParams, generate_topology


def generate(hosts: int, rails: int = 2, hosts_per_leaf: int = 8, spines: int = 2,
             links_per_spine: int = 1, name: str | None = None) -> dict[str, Any]:
    """A `lockstep.topology/v1` document for a rail-optimized leaf-spine fabric."""
    for label, value in (("hosts", hosts), ("rails", rails), ("hosts_per_leaf", hosts_per_leaf),
                         ("spines", spines), ("links_per_spine", links_per_spine)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    params = TopoParams(hosts=hosts, rails=rails, hosts_per_leaf=hosts_per_leaf, spines=spines,
                        links_per_leaf_spine=links_per_spine)
    return generate_topology(params, name=name)
