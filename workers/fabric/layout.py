"""Positions for drawing a fabric as layered SVG: hosts at the bottom, each switch layer above
at its hop distance from the NICs (leaf, spine, core), ordered to keep cables short.

Two drawings, chosen by size:

- **Full** (at most `FULL_MAX_LINKS` cables and `FULL_MAX_WIDTH` wide): every host with its
  NICs, every switch, every cable. Every name is drawn whole: boxes are as wide as their label
  (labels are monospace, so their width is known here: `label_width`), switches of a layer are
  placed as close above what they serve as their neighbours allow, never overlapping, and a
  small fabric is spread over at least `MIN_WIDTH` so it fills a page without larger text.
- **Aggregated** (larger fabrics: 1,024 GPUs already make a full drawing ~17,000 px wide, and
  the 9,216-GPU one has ~24k cables): a browser cannot draw and recolor tens of thousands of
  lines without stalling, and nobody can read them. Elements are gathered into *groups* of
  structurally equivalent members: hosts cabled to the same set of switches (a scalable unit),
  then, layer by layer upwards, switches cabled to the same set of groups below (the leaves of a
  unit, the spines of a pod, a core plane). Every host and switch is still drawn, as a cell
  inside its group's box, so each keeps its own health color; the cables between two groups
  are drawn as one *bundle* whose health summarizes its members. A layer never has more than
  `MAX_GROUPS_PER_LAYER` groups (consecutive groups are merged), so the drawing stays small
  whatever the wiring.

Pure: a Topology in, coordinates out.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

from workers.fabric.topology import Topology

# Labels: monospace at LABEL_PX, so a label of n characters is n * CHAR_W wide (0.6 em, rounded up).
LABEL_PX = 11
CHAR_W = 6.8
LABEL_PAD = 6

# Full drawing.
NIC_PITCH = 14  # horizontal space per NIC inside a host box
NIC_R = 4
HOST_GAP = 12
HOST_H = 38
SWITCH_H = 24
SWITCH_MIN_W = 56
SWITCH_GAP = 12
LAYER_GAP = 120
MARGIN = 20
MIN_WIDTH = 1200
FULL_MAX_WIDTH = 2400
FULL_MAX_LINKS = 2500

# Aggregated drawing.
MAX_GROUPS_PER_LAYER = 48
GROUP_COLS = 16  # the most cells in a row of a group box (fewer when that lets cells be larger)
GROUP_PAD = 6
GROUP_LABEL_H = 18
GROUP_MIN_W = 96
GROUP_GAP = 14
AGG_LAYER_GAP = 90
# Cells are as large as the drawing allows: big enough to click at 1,024 GPUs, small at 9,216.
CELL_SIZES = (14, 12, 10, 8)


def label_width(text: str) -> float:
    """Width of a label as the page draws it (monospace, LABEL_PX)."""
    return len(text) * CHAR_W


@dataclass
class Layout:
    width: int
    height: int
    aggregated: bool = False
    hosts: list[dict] = field(default_factory=list)
    nics: list[dict] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    groups: list[dict] = field(default_factory=list)
    bundles: list[dict] = field(default_factory=list)
    # What is drawn, in numbers: hosts, NICs, switches, cables.
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def bundle_of_link(self) -> dict[str, str]:
        return {link: b["id"] for b in self.bundles for link in b["links"]}


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


def layout(topology: Topology, full_max_links: int | None = None, full_max_width: int | None = None) -> Layout:
    """The drawing of a fabric: full when it has at most `full_max_links` (default
    `FULL_MAX_LINKS`) cables and the full drawing is at most `full_max_width` (default
    `FULL_MAX_WIDTH`) wide; aggregated otherwise."""
    if len(topology.links) > (FULL_MAX_LINKS if full_max_links is None else full_max_links):
        return aggregated_layout(topology)
    drawing = full_layout(topology)
    if drawing.width > (FULL_MAX_WIDTH if full_max_width is None else full_max_width):
        return aggregated_layout(topology)
    return drawing


def place_in_row(widths: list[float], targets: list[float], low: float, high: float, gap: float) -> list[float]:
    """Left edges for boxes kept in this order, each as close as it can be to centering on its
    target, never overlapping (`gap` apart) and within [low, high]. Needs the row to fit."""
    xs: list[float] = []
    cursor = low
    for w, target in zip(widths, targets, strict=True):
        x = max(target - w / 2, cursor)
        xs.append(x)
        cursor = x + w + gap
    limit = high
    for i in reversed(range(len(xs))):
        if xs[i] + widths[i] > limit:
            xs[i] = limit - widths[i]
        limit = xs[i] - gap
    return xs


def full_layout(topology: Topology, min_width: int = MIN_WIDTH) -> Layout:
    levels = switch_levels(topology)
    max_level = max(levels.values(), default=0)
    nics_by_host: dict[str, list[str]] = defaultdict(list)
    for nic in topology.nics:
        nics_by_host[nic.host].append(nic.name)
    layers: dict[int, list[str]] = defaultdict(list)
    for s in topology.switches:
        layers[levels[s.name]].append(s.name)
    tiers = {s.name: s.tier for s in topology.switches}
    switch_w = {s.name: max(SWITCH_MIN_W, label_width(s.name) + 2 * LABEL_PAD) for s in topology.switches}

    # As wide as the widest row (hosts, or a switch layer), and at least min_width.
    host_w = [max(len(nics_by_host.get(h.name, ())) * NIC_PITCH + 8, label_width(h.name) + 2 * LABEL_PAD)
              for h in topology.hosts]
    rows = [sum(host_w) + HOST_GAP * max(len(host_w) - 1, 0)]
    rows += [sum(switch_w[n] for n in names) + SWITCH_GAP * (len(names) - 1) for names in layers.values()]
    inner = max(max(rows), min_width - 2 * MARGIN)

    # Hosts, left to right in topology order, each centered in an equal share of the row.
    host_y = MARGIN + max_level * LAYER_GAP + SWITCH_H + 40
    hosts, nics, position = [], [], {}
    spare = (inner - rows[0]) / max(len(host_w), 1)
    x = MARGIN + spare / 2
    for host, width in zip(topology.hosts, host_w, strict=True):
        names = nics_by_host.get(host.name, [])
        hosts.append({"name": host.name, "x": round(x, 1), "y": host_y, "w": round(width, 1), "h": HOST_H})
        first = x + (width - len(names) * NIC_PITCH) / 2 + NIC_PITCH / 2
        for i, nic in enumerate(names):
            nx, ny = round(first + NIC_PITCH * i, 1), host_y + 8
            nics.append({"name": nic, "host": host.name, "x": nx, "y": ny})
            position[nic] = (nx, ny)
        x += width + HOST_GAP + spare

    # Switch layers bottom-up, each ordered by the mean x of what it connects to below, and placed
    # as close above it as the layer allows.
    neighbors: dict[str, list[str]] = defaultdict(list)
    for link in topology.links:
        neighbors[link.a].append(link.b)
        neighbors[link.b].append(link.a)
    switches = []
    for level in sorted(layers):
        names = layers[level]

        def barycenter(name: str) -> float:
            below = [position[n][0] for n in neighbors[name] if n in position]
            return sum(below) / len(below) if below else math.inf

        names.sort(key=lambda n: (barycenter(n), n))
        widths = [switch_w[n] for n in names]
        even = [MARGIN + inner * (i + 0.5) / len(names) for i in range(len(names))]
        # Mostly above what it serves, a little toward an even spread: switches that all serve the
        # same hosts (the spines) do not bunch up in the middle.
        targets = [even[i] if barycenter(n) == math.inf else 0.7 * barycenter(n) + 0.3 * even[i]
                   for i, n in enumerate(names)]
        y = MARGIN + (max_level - level) * LAYER_GAP
        placed = place_in_row(widths, targets, MARGIN, MARGIN + inner, SWITCH_GAP)
        for name, w, sx in zip(names, widths, placed, strict=True):
            box = {"name": name, "x": round(sx, 1), "y": y, "w": round(w, 1), "h": SWITCH_H, "tier": tiers[name],
                   "level": level}
            switches.append(box)
            position[name] = (box["x"] + box["w"] / 2, y + SWITCH_H)
    # Cables: from the bottom edge of the upper end to the lower end.
    top_edge = {s["name"]: (s["x"] + s["w"] / 2, s["y"]) for s in switches}
    links = []
    for link in topology.links:
        a, b = link.a, link.b
        (x1, y1), (x2, y2) = position[a], position[b]
        if y1 > y2:  # a is below b: draw to b's bottom, from a's top
            x1, y1 = top_edge.get(a, (x1, y1))
        else:
            x2, y2 = top_edge.get(b, (x2, y2))
        links.append({"id": link.id, "a": a, "b": b, "x1": x1, "y1": y1, "x2": x2, "y2": y2})
    return Layout(width=int(math.ceil(inner + 2 * MARGIN)), height=int(host_y + HOST_H + MARGIN), hosts=hosts,
                  nics=nics, switches=switches, links=links, counts=_counts(topology))


def _counts(topology: Topology) -> dict[str, int]:
    return {"hosts": len(topology.hosts), "nics": len(topology.nics), "switches": len(topology.switches),
            "cables": len(topology.links)}


# --- aggregated drawing ---------------------------------------------------------------------


def _classes(members: list[str], signature: dict[str, frozenset]) -> list[list[str]]:
    """Members with equal signatures, in order of first appearance."""
    by_sig: dict[frozenset, list[str]] = {}
    for m in members:
        by_sig.setdefault(signature[m], []).append(m)
    return list(by_sig.values())


def _cap(classes: list[list[str]], limit: int) -> list[list[str]]:
    """Merge consecutive classes so that there are at most `limit`."""
    if len(classes) <= limit:
        return classes
    n = len(classes)
    return [[m for c in classes[i * n // limit:(i + 1) * n // limit] for m in c] for i in range(limit)]


def _label(members: list[str], noun: str) -> str:
    if len(members) == 1:
        return members[0]
    return f"{members[0]} … {members[-1]} ({len(members)} {noun})"


def _short_label(members: list[str]) -> str:
    """What a group box says: its only member, or its first and last (`node0000–node0031`)."""
    return members[0] if len(members) == 1 else f"{members[0]}–{members[-1]}"


def _boxes(layer_groups: dict[int, list[list[str]]], cell: int, max_cols: int) -> tuple[dict[str, dict], float]:
    """Group boxes sized for their members (cells of `cell` px, at most `max_cols` a row) and
    their label; and the width of the widest layer."""
    pitch = cell + 2
    boxes: dict[str, dict] = {}
    for level, groups in layer_groups.items():
        for i, members in enumerate(groups):
            cols = min(len(members), max_cols)
            rows = math.ceil(len(members) / cols)
            w = max(GROUP_MIN_W, 2 * GROUP_PAD + cols * pitch - 2, label_width(_short_label(members)) + 2 * GROUP_PAD)
            h = GROUP_LABEL_H + GROUP_PAD + rows * pitch
            boxes[f"L{level}G{i}"] = {"id": f"L{level}G{i}", "level": level, "members": members, "w": round(w, 1),
                                      "h": h, "kind": "hosts" if level == 0 else "switches", "cell": cell,
                                      "cols": cols}
    widest = max(
        (sum(boxes[f"L{lv}G{i}"]["w"] for i in range(len(gs))) + GROUP_GAP * (len(gs) + 1)
         for lv, gs in layer_groups.items()),
        default=0,
    )
    return boxes, widest


def aggregated_layout(topology: Topology) -> Layout:
    levels = switch_levels(topology)
    host_of = {nic.name: nic.host for nic in topology.nics}
    level_of: dict[str, int] = {h.name: 0 for h in topology.hosts} | levels

    def owner(end: str) -> str:  # a NIC is drawn as (part of) its host
        return host_of.get(end, end)

    adjacency: dict[str, set[str]] = defaultdict(set)
    for link in topology.links:
        a, b = owner(link.a), owner(link.b)
        adjacency[a].add(b)
        adjacency[b].add(a)

    # Groups, bottom-up: hosts by the switches they are cabled to, then each switch layer by the
    # groups below it that it is cabled to.
    group_of: dict[str, str] = {}
    layer_groups: dict[int, list[list[str]]] = {}
    hosts = [h.name for h in topology.hosts]
    signature = {h: frozenset(n for n in adjacency[h] if level_of[n] > 0) for h in hosts}
    layer_groups[0] = _cap(_classes(hosts, signature), MAX_GROUPS_PER_LAYER)
    by_level: dict[int, list[str]] = defaultdict(list)
    for s in topology.switches:
        by_level[levels[s.name]].append(s.name)

    def assign(level: int) -> None:
        for i, members in enumerate(layer_groups[level]):
            for m in members:
                group_of[m] = f"L{level}G{i}"

    assign(0)
    for level in sorted(by_level):
        names = by_level[level]
        signature = {
            s: frozenset(group_of[n] for n in adjacency[s] if level_of[n] < level) for s in names
        }
        layer_groups[level] = _cap(_classes(names, signature), MAX_GROUPS_PER_LAYER)
        assign(level)

    # Bundles: the cables between two groups (or within one).
    bundle_links: dict[tuple[str, str], list[str]] = {}
    bundle_nics: dict[tuple[str, str], set[str]] = defaultdict(set)
    group_rank = {f"L{lv}G{i}": (lv, i) for lv, gs in layer_groups.items() for i in range(len(gs))}
    for link in topology.links:
        ga, gb = group_of[owner(link.a)], group_of[owner(link.b)]
        key = (ga, gb) if group_rank[ga] <= group_rank[gb] else (gb, ga)
        bundle_links.setdefault(key, []).append(link.id)
        for end in (link.a, link.b):
            if end in host_of:
                bundle_nics[key].add(end)

    # Geometry: group boxes sized by their members, layers stacked top (highest level) down; cells
    # as large as they can be without making the drawing wider than the smallest cells need.
    smallest, need = _boxes(layer_groups, CELL_SIZES[-1], GROUP_COLS)
    budget = max(need, MIN_WIDTH - 2 * MARGIN)
    candidates = (_boxes(layer_groups, cell, cols) for cell in CELL_SIZES[:-1] for cols in (GROUP_COLS, 12, 8, 6, 4))
    boxes, widest = next(((b, w) for b, w in candidates if w <= budget), (smallest, need))
    width = max(widest, MIN_WIDTH - 2 * MARGIN) + 2 * MARGIN

    # Horizontal order: hosts in topology order; each layer above by the mean x of its groups below.
    below_of: dict[str, list[str]] = defaultdict(list)
    for ga, gb in bundle_links:
        if group_rank[ga][0] < group_rank[gb][0]:
            below_of[gb].append(ga)
    center_x: dict[str, float] = {}
    levels_sorted = sorted(layer_groups)
    for level in levels_sorted:
        ids = [f"L{level}G{i}" for i in range(len(layer_groups[level]))]
        if level:
            def barycenter(gid: str) -> tuple[float, int]:
                xs = [center_x[g] for g in below_of[gid] if g in center_x]
                return (sum(xs) / len(xs) if xs else math.inf, group_rank[gid][1])

            ids.sort(key=barycenter)
        total = sum(boxes[g]["w"] for g in ids)
        gap = (width - 2 * MARGIN - total) / (len(ids) + 1) if ids else 0
        x = MARGIN + gap
        for g in ids:
            boxes[g]["x"] = round(x, 1)
            center_x[g] = x + boxes[g]["w"] / 2
            x += boxes[g]["w"] + gap
    y = MARGIN
    for level in reversed(levels_sorted):
        ids = [f"L{level}G{i}" for i in range(len(layer_groups[level]))]
        for g in ids:
            boxes[g]["y"] = y
        y += max((boxes[g]["h"] for g in ids), default=0) + AGG_LAYER_GAP
    height = y - AGG_LAYER_GAP + MARGIN

    groups, host_cells, switch_cells = [], [], []
    tiers = {s.name: s.tier for s in topology.switches}
    for box in sorted(boxes.values(), key=lambda b: (-b["level"], b["x"])):
        noun = "hosts" if box["level"] == 0 else "switches"
        groups.append({**box, "label": _label(box["members"], noun), "short": _short_label(box["members"]),
                       "count": len(box["members"])})
        size, cols = box["cell"], box["cols"]
        left = box["x"] + (box["w"] - (cols * (size + 2) - 2)) / 2  # the cells centered in the box
        for k, name in enumerate(box["members"]):
            cell = {"name": name, "group": box["id"],
                    "x": round(left + (k % cols) * (size + 2), 1),
                    "y": box["y"] + GROUP_LABEL_H + (k // cols) * (size + 2), "w": size, "h": size}
            if box["level"] == 0:
                host_cells.append(cell)
            else:
                switch_cells.append(cell | {"tier": tiers[name], "level": box["level"]})

    bundles = []
    for n, ((ga, gb), link_ids) in enumerate(bundle_links.items()):
        a, b = boxes[ga], boxes[gb]
        if ga == gb:  # cables inside one group: a loop under the box
            x1, x2, yb = a["x"] + 8, a["x"] + a["w"] - 8, a["y"] + a["h"]
            d = f"M{x1:g} {yb:g} Q{(x1 + x2) / 2:g} {yb + 30:g} {x2:g} {yb:g}"
        elif a["level"] == b["level"]:  # same layer: a curve below both
            x1, x2 = a["x"] + a["w"] / 2, b["x"] + b["w"] / 2
            y1, y2 = a["y"] + a["h"], b["y"] + b["h"]
            d = f"M{x1:g} {y1:g} Q{(x1 + x2) / 2:g} {max(y1, y2) + 40:g} {x2:g} {y2:g}"
        else:  # lower group's top edge to upper group's bottom edge
            lower, upper = (a, b) if a["level"] < b["level"] else (b, a)
            d = (f"M{lower['x'] + lower['w'] / 2:g} {lower['y']:g} "
                 f"L{upper['x'] + upper['w'] / 2:g} {upper['y'] + upper['h']:g}")
        bundles.append({
            "id": f"B{n}", "a": ga, "b": gb, "d": d, "count": len(link_ids), "links": link_ids,
            "nics": sorted(bundle_nics.get((ga, gb), ())),
            "stroke": round(min(1 + math.log2(len(link_ids)) / 2, 7), 1),
            "label": f"{len(link_ids)} cables: {_label(a['members'], 'hosts' if a['level'] == 0 else 'switches')}"
                     f" ↔ {_label(b['members'], 'hosts' if b['level'] == 0 else 'switches')}",
        })
    return Layout(width=int(width), height=int(height), aggregated=True, hosts=host_cells,
                  switches=switch_cells, groups=groups, bundles=bundles, counts=_counts(topology))


def summarize_health(healths) -> tuple[str, dict[str, int]]:
    """One health for many members: down if all are down, degraded if any is down or degraded,
    ok if all are ok, else unknown; with the count per health."""
    counts: dict[str, int] = {}
    for h in healths:
        counts[h] = counts.get(h, 0) + 1
    total = sum(counts.values())
    bad = counts.get("down", 0) + counts.get("degraded", 0)
    if total and counts.get("down", 0) == total:
        return "down", counts
    if bad:
        return "degraded", counts
    if total and counts.get("ok", 0) == total:
        return "ok", counts
    return "unknown", counts
