"""Probe plans (workers/probeplan): the peers of each NIC, coverage of every element, the
identifiability of the full mesh at a fraction of its size, determinism and stability."""

from __future__ import annotations

import random

import pytest

from testbed.simulate.topology import PRESETS, TopoParams, generate_topology
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology
from workers.probeplan import ambiguous_groups, coverage_report, plan_probes


def index_of(params: TopoParams) -> PathIndex:
    return PathIndex(parse_topology(generate_topology(params)))


@pytest.fixture(scope="module")
def example():
    return index_of(PRESETS["example"][0])


@pytest.fixture(scope="module")
def three_tier():
    return index_of(TopoParams(hosts=32, rails=4, hosts_per_leaf=4, spines=4, links_per_leaf_spine=1,
                               su_per_pod=2, cores_per_plane=2, links_per_spine_core=1))


def non_rail(hosts_per_leaf=4, leaves=4, spines=3, nics=1) -> PathIndex:
    sw = [{"name": f"L{j}", "tier": "leaf"} for j in range(leaves)] + [{"name": f"S{j}", "tier": "spine"}
                                                                      for j in range(spines)]
    nic_list, links, hosts = [], [], []
    for j in range(leaves):
        for i in range(hosts_per_leaf):
            h = f"h{j}-{i}"
            hosts.append({"name": h})
            for k in range(nics):
                nic_list.append({"name": f"{h}/{k}", "host": h})
                links.append({"id": f"a-{h}-{k}", "a": f"{h}/{k}", "b": f"L{j}"})
        for s in range(spines):
            links.append({"id": f"L{j}S{s}", "a": f"L{j}", "b": f"S{s}"})
    return PathIndex(parse_topology({"format": "lockstep.topology/v1", "name": "nr", "hosts": hosts,
                                     "switches": sw, "nics": nic_list, "links": links}))


def full_mesh(index: PathIndex):
    nn = index.nic_names
    return [(a, b) for a in nn for b in nn if a != b]


def test_each_nic_probes_its_leaf_its_host_and_a_cross_leaf_sample(example):
    plan = plan_probes(example, seed=3, cross_leaf=8)
    topo = example.topology
    leaf = {link.a: link.b for link in topo.links if example.topology.is_nic(link.a)}
    host = {n.name: n.host for n in topo.nics}
    for s, peers in plan.peers.items():
        assert s not in peers and len(set(peers)) == len(peers)
        same_leaf = {d for d in leaf if leaf[d] == leaf[s] and d != s}
        same_host = {d for d in host if host[d] == host[s] and d != s}
        assert same_leaf <= set(peers) and same_host <= set(peers)
        cross = [d for d in peers if d not in same_leaf | same_host]
        assert len(cross) == 8
        assert len({leaf[d] for d in cross}) == 8  # one NIC on each of 8 other leaves
    assert plan.sizes() == {"mean": 22.0, "min": 22, "max": 22, "total_pairs": 22 * 256}


@pytest.mark.parametrize("fabric", ["example", "three_tier"])
def test_every_element_is_covered_several_times(fabric, request):
    index = request.getfixturevalue(fabric)
    report = coverage_report(index, plan_probes(index, seed=1))
    assert report["link_direction_min"] >= 3
    assert report["switch_min"] >= 3
    assert report["nic_tx_min"] >= 3 and report["nic_rx_min"] >= 3


@pytest.mark.parametrize("fabric", ["example", "three_tier", "non_rail"])
def test_the_plan_tells_apart_every_element_the_full_mesh_does(fabric, request):
    index = non_rail() if fabric == "non_rail" else request.getfixturevalue(fabric)
    plan = plan_probes(index, seed=5)
    assert len(plan.pairs()) < len(full_mesh(index)) / 2
    assert ambiguous_groups(index, plan.pairs()) == ambiguous_groups(index, full_mesh(index))


def test_what_no_plan_can_tell_apart_without_paths():
    # a leaf's uplinks in a two-tier Clos: every pair crosses each with the same share
    groups = ambiguous_groups(non_rail(), full_mesh(non_rail()))
    assert ("L0S0 (L0->S0)", "L0S1 (L0->S1)", "L0S2 (L0->S2)") in groups


def test_missing_cross_leaf_coverage_is_repaired():
    index = non_rail(hosts_per_leaf=3, leaves=4, spines=3)
    bare = plan_probes(index, seed=0, cross_leaf=0, repair=False)
    assert coverage_report(index, bare)["link_direction_min"] == 0
    plan = plan_probes(index, seed=0, cross_leaf=0)
    assert plan.stats["repair_pairs"] > 0
    assert coverage_report(index, plan)["link_direction_min"] >= 3


def test_the_plan_is_deterministic_for_a_seed_and_not_across_seeds(example):
    a, b = plan_probes(example, seed=7), plan_probes(example, seed=7)
    assert a.peers == b.peers
    c = plan_probes(example, seed=8)
    assert c.peers != a.peers
    assert all(len(c.peers[s]) == len(a.peers[s]) for s in a.peers)


def test_the_plan_depends_on_names_not_on_the_order_of_the_document():
    doc = generate_topology(PRESETS["example"][0])
    shuffled = {k: (random.Random(1).sample(v, len(v)) if isinstance(v, list) else v) for k, v in doc.items()}
    a = plan_probes(parse_topology(doc), seed=2)
    b = plan_probes(parse_topology(shuffled), seed=2)
    assert a.peers == b.peers


def test_a_nic_leaving_changes_only_the_choices_it_held(example):
    full = plan_probes(example, seed=4)
    gone = "node0005/nic3"
    members = set(example.nic_names) - {gone}
    less = plan_probes(example, seed=4, members=members)
    assert gone not in less.peers
    changed = 0
    for s, peers in less.peers.items():
        before = [d for d in full.peers[s] if d != gone]
        if list(peers) != before:
            changed += 1
            # the one replacement of a cross-leaf choice that was the NIC that left
            assert gone in full.peers[s]
            assert len(set(peers) - set(before)) <= 1
    holders = sum(1 for s in full.peers if gone in full.peers[s])
    assert changed <= holders < 40
    # and coming back restores the plan exactly
    assert plan_probes(example, seed=4, members=set(example.nic_names)).peers == full.peers


def test_a_new_host_takes_only_a_fair_share_of_choices():
    params = PRESETS["example"][0]
    index = index_of(params)
    without = {n for n in index.nic_names if not n.startswith("node0031/")}
    before = plan_probes(index, seed=9, members=without)
    after = plan_probes(index, seed=9)
    moved = sum(len(set(before.peers[s]) - set(after.peers[s])) for s in before.peers)
    total = sum(len(p) for p in before.peers.values())
    assert moved < 0.05 * total


def test_unknown_members_are_refused(example):
    with pytest.raises(KeyError, match="'nobody' is not a NIC"):
        plan_probes(example, members=["nobody"])
