"""Positions for drawing a fabric as layered SVG: hosts at the bottom, each switch layer above
at its hop distance from the NICs (leaf, spine, core), ordered to keep cables short.

Pure: a Topology in, coordinates out.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from workers.fabric.topology import Topology

NIC_PITCH = 14  # horizontal space per NIC inside a host box
HOST_GAP = 10
SWITCH_W, SWITCH_H = 70, 22
LAYER_GAP = 110
MARGIN = 20
HOST_H = 34


@dataclass
class Layout:
    width: int
    height: int
    hosts: list[dict] = field(default_factory=list)
    nics: list[dict] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)


def switch_levels(topology: Topology) -> dict[str, int]:
    """Hop distance of every switch from the nearest NIC (1 = leaf). Unreachable switches go on top."""
    neighbors: dict[str, set[str]] = defaultdict(set)
    for link in topology.links:
        neighbors[link.a].add(link.b)
        neighbors[link.b].add(link.a)
    level: dict[str, int] = {nic.name: 0 for nic in topology.nics}
    queue = deque(level)
    while queue:
        current = queue.popleft()
        for other in neighbors[current]:
            if other not in level and topology.is_switch(other):
                level[other] = level[current] + 1
                queue.append(other)
    top = max((v for k, v in level.items() if topology.is_switch(k)), default=0) + 1
    return {s.name: level.get(s.name, top) for s in topology.switches}


def layout(topology: Topology) -> Layout:
    levels = switch_levels(topology)
    max_level = max(levels.values(), default=0)
    nics_by_host: dict[str, list[str]] = defaultdict(list)
    for nic in topology.nics:
        nics_by_host[nic.host].append(nic.name)

    # Hosts, left to right in topology order.
    x = MARGIN
    host_y = MARGIN + max_level * LAYER_GAP + SWITCH_H + 40
    hosts, nics, position = [], [], {}
    for host in topology.hosts:
        host_nics = nics_by_host.get(host.name, [])
        width = max(len(host_nics), 2) * NIC_PITCH + 8
        hosts.append({"name": host.name, "x": x, "y": host_y, "w": width, "h": HOST_H})
        for i, nic in enumerate(host_nics):
            nx, ny = x + 4 + NIC_PITCH * i + NIC_PITCH / 2, host_y + 6
            nics.append({"name": nic, "x": nx, "y": ny})
            position[nic] = (nx, ny)
        x += width + HOST_GAP
    width = max(x, MARGIN * 2 + SWITCH_W)

    # Switch layers bottom-up, each ordered by the mean x of what it connects to below.
    neighbors: dict[str, list[str]] = defaultdict(list)
    for link in topology.links:
        neighbors[link.a].append(link.b)
        neighbors[link.b].append(link.a)
    switches = []
    layers: dict[int, list[str]] = defaultdict(list)
    for s in topology.switches:
        layers[levels[s.name]].append(s.name)
    tiers = {s.name: s.tier for s in topology.switches}
    for level in sorted(layers):
        names = layers[level]

        def barycenter(name: str) -> float:
            below = [position[n][0] for n in neighbors[name] if n in position]
            return sum(below) / len(below) if below else float("inf")

        names.sort(key=lambda n: (barycenter(n), n))
        count = len(names)
        span = max(width - 2 * MARGIN - SWITCH_W, 0)
        y = MARGIN + (max_level - level) * LAYER_GAP
        for i, name in enumerate(names):
            sx = MARGIN + (span * (i + 0.5) / count if count else 0)
            switches.append({"name": name, "x": sx, "y": y, "w": SWITCH_W, "h": SWITCH_H, "tier": tiers[name]})
            position[name] = (sx + SWITCH_W / 2, y + SWITCH_H)
    # Cables: from the bottom edge of the upper end to the lower end.
    top_edge = {s["name"]: (s["x"] + SWITCH_W / 2, s["y"]) for s in switches}
    links = []
    for link in topology.links:
        a, b = link.a, link.b
        (x1, y1), (x2, y2) = position[a], position[b]
        if y1 > y2:  # a is below b: draw to b's bottom, from a's top
            x1, y1 = top_edge.get(a, (x1, y1))
        else:
            x2, y2 = top_edge.get(b, (x2, y2))
        links.append({"id": link.id, "x1": x1, "y1": y1, "x2": x2, "y2": y2})
    return Layout(width=int(width), height=int(host_y + HOST_H + MARGIN), hosts=hosts, nics=nics,
                  switches=switches, links=links)
