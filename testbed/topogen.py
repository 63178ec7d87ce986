"""A minimal generator of rail-optimized two-tier (leaf-spine) topologies for the emulator.

Naming follows the shared scenarios: hosts ``node0000``, NICs ``node0000/nic0`` (NIC k on rail
k), leaves ``leaf-su00-r0`` (one leaf per rail per scalable unit of `hosts_per_leaf` hosts),
spines ``spine-p0-00``, access links ``node0000/nic0~leaf-su00-r0`` and leaf-spine links
``leaf-su00-r0~spine-p0-00#0`` (``#k`` numbers parallel links). Every leaf is cabled to every
spine, so traffic between leaves and between rails crosses the spine layer.

The larger generator (three tiers, thousands of GPUs) lives in ``testbed/simulate/``; this one
only covers what fits in namespaces on one machine.
"""

from __future__ import annotations

from typing import Any

from workers.fabric.topology import FORMAT


def generate(hosts: int, rails: int = 2, hosts_per_leaf: int = 8, spines: int = 2,
             links_per_spine: int = 1, name: str | None = None) -> dict[str, Any]:
    """A `lockstep.topology/v1` document for a rail-optimized leaf-spine fabric."""
    for label, value, low in (("hosts", hosts, 1), ("rails", rails, 1), ("hosts_per_leaf", hosts_per_leaf, 1),
                              ("spines", spines, 1), ("links_per_spine", links_per_spine, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    units = (hosts + hosts_per_leaf - 1) // hosts_per_leaf
    doc: dict[str, Any] = {
        "format": FORMAT,
        "name": name or f"rail{rails}-h{hosts}-su{hosts_per_leaf}-s{spines}x{links_per_spine}",
        "hosts": [], "switches": [], "nics": [], "links": [],
    }
    leaves = [[f"leaf-su{su:02d}-r{r}" for r in range(rails)] for su in range(units)]
    spine_names = [f"spine-p0-{s:02d}" for s in range(spines)]
    for su in range(units):
        for leaf in leaves[su]:
            doc["switches"].append({"name": leaf, "tier": "leaf"})
    for spine in spine_names:
        doc["switches"].append({"name": spine, "tier": "spine"})
    for i in range(hosts):
        host = f"node{i:04d}"
        doc["hosts"].append({"name": host})
        for r in range(rails):
            nic = f"{host}/nic{r}"
            leaf = leaves[i // hosts_per_leaf][r]
            doc["nics"].append({"name": nic, "host": host, "rail": r})
            doc["links"].append({"id": f"{nic}~{leaf}", "a": nic, "b": leaf})
    for su in range(units):
        for leaf in leaves[su]:
            for spine in spine_names:
                for k in range(links_per_spine):
                    doc["links"].append({"id": f"{leaf}~{spine}#{k}", "a": leaf, "b": spine})
    return doc
