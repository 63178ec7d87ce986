"""The fabric drawing: layers by hop distance, coordinates for every cable, aggregation of large
fabrics into groups and bundles that keep every host and switch visible."""

from __future__ import annotations

import random

import pytest

from testbed.simulate.topology import PRESETS, generate_topology
from workers.fabric import layout as L
from workers.fabric.topology import parse_topology


def fabric(preset: str):
    return parse_topology(generate_topology(PRESETS[preset][0]))


def small(extra_switches=(), extra_links=()):
    doc = {
        "format": "lockstep.topology/v1", "name": "t",
        "hosts": [{"name": f"h{i}"} for i in range(4)],
        "switches": [{"name": "leaf-a", "tier": "leaf"}, {"name": "leaf-b", "tier": "leaf"},
                     {"name": "spine", "tier": "spine"}, *extra_switches],
        "nics": [{"name": f"h{i}/nic0", "host": f"h{i}"} for i in range(4)],
        # h0, h1 on leaf-b and h2, h3 on leaf-a: the leaves are listed against the host order.
        "links": [{"id": f"h{i}~{'leaf-b' if i < 2 else 'leaf-a'}", "a": f"h{i}/nic0",
                   "b": "leaf-b" if i < 2 else "leaf-a"} for i in range(4)]
        + [{"id": "leaf-a~spine", "a": "leaf-a", "b": "spine"}, {"id": "leaf-b~spine", "a": "leaf-b", "b": "spine"},
           *extra_links],
    }
    return parse_topology(doc)


def demo_fabric(hosts=8, rails=2):
    """The demo's fabric: 8 hosts x 2 rails, 4 leaves, 2 spines (`make demo`)."""
    from testbed.topogen import generate

    return parse_topology(generate(hosts=hosts, rails=rails, hosts_per_leaf=max(1, hosts // 2), spines=2))


def _overlap(a, b) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]


# --- legibility ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("hosts", "rails"), [(8, 2), (4, 1), (16, 4), (2, 8)])
def test_every_name_fits_its_box_and_no_two_boxes_overlap(hosts, rails):
    drawing = L.layout(demo_fabric(hosts, rails))
    assert not drawing.aggregated
    boxes = drawing.hosts + drawing.switches
    for box in boxes:
        assert L.label_width(box["name"]) + 2 * L.LABEL_PAD <= box["w"] + 0.01, box
        assert box["x"] >= 0 and box["x"] + box["w"] <= drawing.width
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not _overlap(a, b), (a["name"], b["name"])
    for nic in drawing.nics:  # every NIC inside its host
        host = next(h for h in drawing.hosts if h["name"] == nic["host"])
        assert host["x"] < nic["x"] - L.NIC_R and nic["x"] + L.NIC_R < host["x"] + host["w"]


def test_a_small_fabric_is_spread_over_the_page_width_and_its_leaves_sit_above_their_hosts():
    drawing = L.layout(demo_fabric())
    assert drawing.width >= L.MIN_WIDTH
    hosts = {h["name"]: h for h in drawing.hosts}
    assert hosts["node0007"]["x"] + hosts["node0007"]["w"] > 0.9 * drawing.width
    center = {s["name"]: s["x"] + s["w"] / 2 for s in drawing.switches}
    # su00 serves node0000..3 (the left half), su01 node0004..7
    assert max(center["leaf-su00-r0"], center["leaf-su00-r1"]) < hosts["node0004"]["x"]
    assert min(center["leaf-su01-r0"], center["leaf-su01-r1"]) > hosts["node0003"]["x"] + hosts["node0003"]["w"]


def test_boxes_of_a_row_keep_their_order_stay_apart_and_center_on_their_target_when_there_is_room():
    xs = L.place_in_row([50, 50, 50], [100, 105, 400], 0, 500, 10)
    assert xs[0] == 75 and xs[1] == xs[0] + 60 and xs[2] == 375
    crowded = L.place_in_row([100, 100, 100], [490, 490, 490], 0, 320, 10)
    assert crowded == [0, 110, 220]  # pushed back from the right edge, in order, 10 apart


def test_the_1024_gpu_fabric_gets_cells_big_enough_to_click_and_labels_that_fit():
    drawing = L.layout(fabric("gpu1024"))
    assert {c["w"] for c in drawing.hosts} == {L.CELL_SIZES[0]}
    large = L.layout(fabric("gpu9216"))  # as wide as its 36 leaf groups' labels need, no wider
    assert large.width < 36 * (L.label_width("leaf-su00-r0–leaf-su00-r7") + 2 * L.GROUP_PAD + L.GROUP_GAP) + 100
    for group in drawing.groups + large.groups:
        assert L.label_width(group["short"]) + 2 * L.GROUP_PAD <= group["w"] + 0.01, group["short"]
    assert {g["short"] for g in drawing.groups if g["level"] == 0} >= {"node0000–node0031"}


# --- layers -------------------------------------------------------------------------------------


def test_switch_layers_are_hop_distances_from_the_nics():
    topo = fabric("gpu2048-3tier")
    levels = L.switch_levels(topo)
    assert {levels[s.name] for s in topo.switches if s.tier == "leaf"} == {1}
    assert {levels[s.name] for s in topo.switches if s.tier == "spine"} == {2}
    assert {levels[s.name] for s in topo.switches if s.tier == "core"} == {3}


def test_an_unreachable_switch_goes_above_the_top_layer():
    topo = small(extra_switches=[{"name": "island", "tier": "x"}, {"name": "island2", "tier": "x"}],
                 extra_links=[{"id": "island~island2", "a": "island", "b": "island2"}])
    levels = L.switch_levels(topo)
    assert levels["island"] == levels["island2"] == 3 and levels["spine"] == 2


def test_full_layout_stacks_layers_and_orders_switches_above_their_hosts():
    drawing = L.layout(small())
    assert not drawing.aggregated
    switches = {s["name"]: s for s in drawing.switches}
    host_top = min(h["y"] for h in drawing.hosts)
    assert switches["spine"]["y"] < switches["leaf-a"]["y"] == switches["leaf-b"]["y"] < host_top
    # leaf-b serves the left hosts, so it is drawn left of leaf-a although listed after it.
    assert switches["leaf-b"]["x"] < switches["leaf-a"]["x"]
    xs = [h["x"] for h in drawing.hosts]
    assert xs == sorted(xs) and [h["name"] for h in drawing.hosts] == ["h0", "h1", "h2", "h3"]


def test_every_cable_has_coordinates_that_meet_its_ends():
    topo = fabric("example")
    drawing = L.full_layout(topo)
    assert not drawing.aggregated
    assert [link["id"] for link in drawing.links] == [link.id for link in topo.links]
    nic_at = {n["name"]: (n["x"], n["y"]) for n in drawing.nics}
    box = {s["name"]: s for s in drawing.switches}
    for link in drawing.links:
        for key in ("x1", "y1", "x2", "y2"):
            assert isinstance(link[key], (int, float))
        assert min(link["x1"], link["x2"]) >= 0 and max(link["x1"], link["x2"]) <= drawing.width
        assert min(link["y1"], link["y2"]) >= 0 and max(link["y1"], link["y2"]) <= drawing.height
        ends = [(link["x1"], link["y1"]), (link["x2"], link["y2"])]
        for name in (link["a"], link["b"]):
            if name in nic_at:
                assert nic_at[name] in ends, link
            else:  # a switch end touches the switch box's top or bottom edge, at its middle
                s = box[name]
                assert any(x == s["x"] + s["w"] / 2 and y in (s["y"], s["y"] + s["h"]) for x, y in ends), link


# --- aggregation --------------------------------------------------------------------------------


def test_the_threshold_chooses_the_drawing():
    topo = small()
    assert not L.layout(topo, full_max_links=len(topo.links)).aggregated
    assert L.layout(topo, full_max_links=len(topo.links) - 1).aggregated
    assert not L.layout(demo_fabric()).aggregated
    # 1,024 GPUs: 2,048 cables would do, but a full drawing would be far too wide to use
    assert L.full_layout(fabric("gpu1024")).width > 6 * L.FULL_MAX_WIDTH
    assert L.layout(fabric("gpu1024")).aggregated
    assert L.layout(fabric("gpu2048-3tier")).aggregated  # 4,608 cables


def _check_aggregated(topo, drawing):
    """Every host and switch drawn once inside its group's box; every cable in one bundle."""
    assert drawing.aggregated and not drawing.links and not drawing.nics
    groups = {g["id"]: g for g in drawing.groups}
    cells = drawing.hosts + drawing.switches
    assert sorted(c["name"] for c in drawing.hosts) == sorted(h.name for h in topo.hosts)
    assert sorted(c["name"] for c in drawing.switches) == sorted(s.name for s in topo.switches)
    for cell in cells:
        g = groups[cell["group"]]
        assert cell["name"] in g["members"]
        assert g["x"] <= cell["x"] and cell["x"] + cell["w"] <= g["x"] + g["w"]
        assert g["y"] <= cell["y"] and cell["y"] + cell["h"] <= g["y"] + g["h"]
    bundled = [link for b in drawing.bundles for link in b["links"]]
    assert sorted(bundled) == sorted(link.id for link in topo.links)
    assert sum(b["count"] for b in drawing.bundles) == len(topo.links)
    per_layer: dict[int, int] = {}
    for g in drawing.groups:
        per_layer[g["level"]] = per_layer.get(g["level"], 0) + 1
        assert g["x"] >= 0 and g["x"] + g["w"] <= drawing.width and g["y"] + g["h"] <= drawing.height
    assert max(per_layer.values()) <= L.MAX_GROUPS_PER_LAYER
    for b in drawing.bundles:
        assert b["a"] in groups and b["b"] in groups and b["d"].startswith("M")
    return per_layer


def test_the_9216_gpu_fabric_is_drawn_as_units_pods_and_planes():
    topo = fabric("gpu9216")
    assert len(topo.links) == 23616
    drawing = L.layout(topo)
    per_layer = _check_aggregated(topo, drawing)
    # Hosts by scalable unit (36 of 32), leaves by unit (36 of 8), spines by pod (18 of 16),
    # and the cores, each cabled to one spine of every pod, in one group.
    assert per_layer == {0: 36, 1: 36, 2: 18, 3: 1}
    assert {g["count"] for g in drawing.groups if g["level"] == 0} == {32}
    assert {g["count"] for g in drawing.groups if g["level"] == 2} == {16}
    # 36 unit→leaves bundles (32 hosts x 8 rails), 36 leaves→pod spines (8 x 16 x 2 parallel),
    # 18 pod spines→cores (16 x 9 x 2).
    access = [b for b in drawing.bundles if b["nics"]]
    assert len(access) == 36 and {(b["count"], len(b["nics"])) for b in access} == {(256, 256)}
    assert sorted(b["count"] for b in drawing.bundles if not b["nics"]) == [256] * 36 + [288] * 18
    elements = len(drawing.hosts) + len(drawing.switches) + len(drawing.groups) + len(drawing.bundles)
    assert elements < 2500  # what the browser draws, instead of ~34k lines, circles and boxes


def test_unstructured_wiring_is_capped_to_a_bounded_number_of_groups():
    rng = random.Random(7)
    hosts = [f"h{i}" for i in range(600)]
    leaves = [f"leaf{i}" for i in range(300)]
    doc = {"format": "lockstep.topology/v1", "name": "random", "hosts": [{"name": h} for h in hosts],
           "switches": [{"name": s, "tier": "leaf"} for s in leaves] + [{"name": "top", "tier": "spine"}],
           "nics": [{"name": f"{h}/n{k}", "host": h} for h in hosts for k in range(2)], "links": []}
    for h in hosts:
        for k, leaf in enumerate(rng.sample(leaves, 2)):
            doc["links"].append({"id": f"{h}/n{k}~{leaf}", "a": f"{h}/n{k}", "b": leaf})
    for leaf in leaves:
        doc["links"].append({"id": f"{leaf}~top", "a": leaf, "b": "top"})
    topo = parse_topology(doc)
    per_layer = _check_aggregated(topo, L.layout(topo, full_max_links=100))
    assert per_layer[0] == per_layer[1] == L.MAX_GROUPS_PER_LAYER  # 600 and 300 distinct signatures, merged


def test_cables_within_a_layer_and_within_a_group_are_bundled_too():
    topo = small(extra_links=[{"id": "leaf-a~leaf-b", "a": "leaf-a", "b": "leaf-b"},
                              {"id": "h0~h1", "a": "h0/nic0", "b": "h1/nic0"}])
    drawing = L.layout(topo, full_max_links=1)
    _check_aggregated(topo, drawing)
    by_link = drawing.bundle_of_link
    bundles = {b["id"]: b for b in drawing.bundles}
    inner = bundles[by_link["h0~h1"]]
    assert inner["a"] == inner["b"] and " Q" in inner["d"]  # a loop under its group
    peer = bundles[by_link["leaf-a~leaf-b"]]
    assert peer["a"] != peer["b"] and " Q" in peer["d"]  # a curve between two groups of one layer


@pytest.mark.parametrize(("healths", "expected"), [
    (["ok", "ok"], "ok"),
    (["ok", "unknown"], "unknown"),
    ([], "unknown"),
    (["ok", "down"], "degraded"),
    (["ok", "degraded", "unknown"], "degraded"),
    (["down", "down"], "down"),
])
def test_bundle_health_summarizes_its_members(healths, expected):
    health, counts = L.summarize_health(healths)
    assert health == expected and sum(counts.values()) == len(healths)
