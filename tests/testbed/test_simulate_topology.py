"""Generated rail-optimized topologies (testbed/simulate/topology.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.simulate.topology import PRESETS, TopoParams, dump_topology, generate_topology, params_from_name
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"


def test_the_example_preset_is_byte_identical_to_the_public_examples():
    text = dump_topology(generate_topology(PRESETS["example"][0]))
    assert text == (SCENARIOS / "ex1-link-loss" / "topology.json").read_text()


@pytest.mark.parametrize(("preset", "counts"), [
    ("example", {"hosts": 32, "nics": 256, "leaves": 32, "spines": 4, "cores": 0, "links": 384}),
    ("gpu1024", {"hosts": 128, "nics": 1024, "leaves": 32, "spines": 16, "cores": 0, "links": 2048}),
    ("gpu2048-3tier", {"hosts": 256, "nics": 2048, "leaves": 64, "spines": 64, "cores": 64, "links": 4096 + 512}),
    ("gpu9216", {"hosts": 1152, "nics": 9216, "leaves": 288, "spines": 288, "cores": 144, "links": 23616}),
    ("gpu9216-2tier", {"hosts": 1152, "nics": 9216, "leaves": 128, "spines": 64, "cores": 0, "links": 17408}),
])
def test_presets_validate_and_have_the_expected_counts(preset, counts):
    params = PRESETS[preset][0]
    assert params.counts() == counts
    topo = parse_topology(generate_topology(params))
    tiers = [s.tier for s in topo.switches]
    assert {
        "hosts": len(topo.hosts), "nics": len(topo.nics), "leaves": tiers.count("leaf"),
        "spines": tiers.count("spine"), "cores": tiers.count("core"), "links": len(topo.links),
    } == counts
    idx = PathIndex(topo)
    assert idx.connected()  # every NIC reaches every other NIC
    assert all(len(topo.nics_of(h.name)) == params.rails for h in topo.hosts[:3])


def test_names_and_link_ids_follow_the_examples():
    topo = parse_topology(generate_topology(PRESETS["gpu2048-3tier"][0]))
    names = {s.name for s in topo.switches}
    assert "leaf-su07-r7" in names and "spine-p3-15" in names and "core-pl15-03" in names
    for link in topo.links:
        if topo.is_nic(link.a):
            assert link.id == f"{link.a}~{link.b}"
            assert re.fullmatch(r"node\d{4}/nic\d~leaf-su\d{2}-r\d", link.id)
        else:
            assert re.fullmatch(rf"{re.escape(link.a)}~{re.escape(link.b)}#\d+", link.id)
            assert (link.a.split("-")[0], link.b.split("-")[0]) in {("leaf", "spine"), ("spine", "core")}
    # NIC k of a host is on rail k and cabled to its SU's rail-k leaf
    nic = topo.nic("node0100/nic5")
    assert nic.rail == 5
    assert any(link.id == "node0100/nic5~leaf-su03-r5" for link in topo.links)


def test_three_tier_pods_and_planes():
    params = PRESETS["gpu2048-3tier"][0]
    idx = PathIndex(parse_topology(generate_topology(params)))
    # same SU, same rail: one leaf; same pod: through a pod spine; other pod: through a core
    assert idx.hop_count("node0000/nic0", "node0001/nic0") == 2
    assert idx.hop_count("node0000/nic0", "node0032/nic0") == 4  # SU 1, same pod (2 SU per pod)
    assert idx.hop_count("node0000/nic0", "node0064/nic0") == 6  # SU 2, next pod
    assert idx.hop_count("node0000/nic0", "node0000/nic1") == 4  # cross-rail inside the pod
    for path in idx.paths("node0000/nic0", "node0064/nic0")[:50]:
        spine_up, core = path[1].split("~")[1].split("#")[0], path[2].split("~")[1].split("#")[0]
        assert core.startswith(f"core-pl{spine_up.split('-')[-1]}-")  # spine j -> plane j


def test_parameters_round_trip_through_the_name_and_bad_ones_are_named():
    for params, _ in PRESETS.values():
        assert params_from_name(params.name) == params
    assert params_from_name("rail2-n4") is None
    with pytest.raises(ValueError, match="hosts must be >= 1"):
        TopoParams(hosts=0)
    with pytest.raises(ValueError, match="cores_per_plane"):
        TopoParams(hosts=128, hosts_per_leaf=8, su_per_pod=1, cores_per_plane=0)


def test_partial_last_scalable_unit():
    params = TopoParams(hosts=10, rails=2, hosts_per_leaf=4, spines=2, links_per_leaf_spine=1)
    topo = parse_topology(generate_topology(params))
    assert params.counts()["leaves"] == 6 == sum(s.tier == "leaf" for s in topo.switches)
    assert PathIndex(topo).connected()
