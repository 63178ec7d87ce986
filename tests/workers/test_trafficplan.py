"""The traffic plan loads every link of generated 1-, 2- and 3-tier fabrics in both directions,
with a bounded number of flows per NIC; its per-agent arguments and the merge of results into
observation windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from testbed.simulate.topology import TopoParams, generate_topology
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology
from workers.trafficplan.assign import agent_args
from workers.trafficplan.plan import FORMAT, PlanError, plan_traffic
from workers.trafficplan.windows import observations


def one_tier(hosts: int = 6, rails: int = 1, keep_spine: bool = False) -> dict:
    """Every NIC on one switch (per rail); the generator's spine removed unless `keep_spine`."""
    doc = generate_topology(TopoParams(hosts=hosts, rails=rails, hosts_per_leaf=hosts, spines=1))
    if not keep_spine:
        doc["switches"] = [s for s in doc["switches"] if s["tier"] != "spine"]
        doc["links"] = [lk for lk in doc["links"] if "spine" not in lk["id"]]
    doc["name"] = f"one-tier-h{hosts}-r{rails}" + ("-spine" if keep_spine else "")
    return doc


FABRICS = {
    "1-tier": one_tier(6),
    "2-tier rail2 su2": generate_topology(TopoParams(hosts=4, rails=2, hosts_per_leaf=2, spines=2)),
    "2-tier rail2 parallel uplinks": generate_topology(TopoParams(hosts=16, rails=2, hosts_per_leaf=8, spines=2,
                                                                  links_per_leaf_spine=2)),
    "2-tier rail8": generate_topology(TopoParams(hosts=32, rails=8, hosts_per_leaf=8, spines=4)),
    "3-tier": generate_topology(TopoParams(hosts=16, rails=2, hosts_per_leaf=2, spines=2, links_per_leaf_spine=2,
                                           su_per_pod=2, cores_per_plane=2, links_per_spine_core=2)),
}


def directed_traversals(index: PathIndex, flows, rng) -> dict[tuple[str, str], int]:
    """Simulate hashing: each flow takes one ECMP path drawn uniformly; count traversals per direction."""
    inc = index.incidence([(f.src, f.dst) for f in flows])
    counts: dict[tuple[str, str], int] = {}
    for f, path in zip(flows, inc.sample_paths(rng), strict=True):
        nodes = index.walk(f.src, path)
        for k, lid in enumerate(path):
            i = index.link_index[lid]
            direction = "a>b" if index.link_a[i] == nodes[k] else "b>a"
            counts[(lid, direction)] = counts.get((lid, direction), 0) + 1
    return counts


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_every_link_is_loaded_both_ways_with_bounded_flows_per_nic(name):
    topo = parse_topology(FABRICS[name])
    plan = plan_traffic(topo, flows_per_nic=16, ports_per_pair=2, epsilon=1e-3)
    target = math.log(1e3)
    assert plan.uncoverable() == [] and plan.below_target() == []
    # every directed link expects at least ln(1/epsilon) flows: each carries one with probability >= 1 - 1e-3
    assert plan.expected_fwd.min() >= target - 1e-9 and plan.expected_rev.min() >= target - 1e-9
    per_nic = plan.flows_per_nic_count()
    assert set(per_nic) == set(PathIndex(topo).nic_names)  # every NIC sends and receives
    assert max(max(s, r) for s, r in per_nic.values()) <= 16
    assert len({s for s, _ in per_nic.values()}) == 1  # rounds are permutations: equal load per NIC
    for f in plan.flows:
        assert topo.nic(f.src).host != topo.nic(f.dst).host  # never to its own host (loopback)
    ports = [(f.src, f.sport) for f in plan.flows]
    assert len(ports) == len(set(ports))  # one source port per flow of a NIC


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_simulated_ecmp_hashing_puts_a_flow_on_every_link_in_each_direction(name):
    """Hashing simulated by drawing each flow's path uniformly among its ECMP paths: over ten
    draws, directed links without a flow are as rare as the plan's bound says (at most one
    miss in ten fabrics' worth of links, where the bound expects well under one)."""
    topo = parse_topology(FABRICS[name])
    index = PathIndex(topo)
    plan = plan_traffic(topo, flows_per_nic=32, epsilon=1e-5)
    wanted = {(lid, d) for lid in index.link_ids for d in ("a>b", "b>a")}
    assert plan.miss_probability_bound() * 10 < 0.1
    misses = []
    for seed in range(10):
        counts = directed_traversals(index, plan.flows, np.random.default_rng(seed))
        misses += [(seed, m) for m in sorted(wanted - set(counts))]
        assert sum(counts.values()) == sum(index.hop_count(f.src, f.dst) for f in plan.flows)
    assert len(misses) <= 1, misses


def test_parallel_uplinks_are_each_covered():
    topo = parse_topology(FABRICS["2-tier rail2 parallel uplinks"])
    plan = plan_traffic(topo)
    doc = plan.to_document()
    parallel = [lk for lk in doc["coverage"]["links"] if lk["id"].endswith("#1")]
    assert parallel and all(lk["a>b"] >= plan.target and lk["b>a"] >= plan.target for lk in parallel)


def test_a_link_no_pair_can_cross_is_reported_not_hidden():
    topo = parse_topology(one_tier(4, keep_spine=True))  # one leaf; the spine hangs off it unused
    plan = plan_traffic(topo)
    assert plan.uncoverable() == [(f"leaf-su00-r0~spine-p0-00#{k}", d) for k in (0, 1) for d in ("a>b", "b>a")]
    assert plan.below_target() == []
    assert plan.to_document()["coverage"]["uncoverable"][0] == {"link": "leaf-su00-r0~spine-p0-00#0", "direction": "a>b"}


def test_a_tight_budget_leaves_links_below_target_and_says_so():
    topo = parse_topology(FABRICS["2-tier rail8"])
    plan = plan_traffic(topo, flows_per_nic=2, ports_per_pair=1)
    assert max(max(v) for v in plan.flows_per_nic_count().values()) <= 2
    assert plan.below_target()  # four spines' uplinks need more than two flows per NIC
    assert plan.to_document()["coverage"]["below_target"]


def test_the_plan_is_deterministic_per_seed_and_serializes():
    topo = parse_topology(FABRICS["3-tier"])
    a, b = plan_traffic(topo, seed=5), plan_traffic(topo, seed=5)
    assert a.to_document() == b.to_document()
    doc = a.to_document()
    assert doc["format"] == FORMAT and doc["flows"][0] == {"id": 0, "src": a.flows[0].src, "dst": a.flows[0].dst,
                                                           "sport": 40000}


@pytest.mark.parametrize("kwargs,word", [({"flows_per_nic": 0}, "flows_per_nic"), ({"ports_per_pair": 0}, "ports_per_pair"),
                                         ({"epsilon": 1.0}, "epsilon"), ({"sport_base": 80}, "sport_base")])
def test_bad_parameters_are_named(kwargs, word):
    with pytest.raises(PlanError, match=word):
        plan_traffic(parse_topology(FABRICS["1-tier"]), **kwargs)


def test_a_single_host_cannot_be_planned():
    with pytest.raises(PlanError, match="two hosts"):
        plan_traffic(parse_topology(one_tier(1, rails=2)))


# -- per-agent arguments and the merge into windows ---------------------------------------------------


def addresses_of(topo) -> dict[str, str]:
    return {n.name: f"172.16.{i // 200}.{i % 200 + 1}" for i, n in enumerate(topo.nics)}


def test_agent_args_give_each_host_its_outgoing_flows_and_a_listener_per_nic():
    topo = parse_topology(FABRICS["2-tier rail2 su2"])
    plan = plan_traffic(topo)
    addrs = addresses_of(topo)
    args = agent_args(plan, topo, addrs, run=9, start_at=1000.0, duration_s=5, rate_mbit=20)
    assert set(args) == {h.name for h in topo.hosts}
    assert sum(len(a["flows"]) for a in args.values()) == len(plan.flows)
    a0 = args["node0000"]
    assert {f["src"] for f in a0["flows"]} == {"node0000/nic0", "node0000/nic1"}
    assert all(f["src_addr"] == addrs[f["src"]] and f["device"] == f["src"].split("/")[1] for f in a0["flows"])
    assert {lis["nic"] for lis in a0["listen"]} == {"node0000/nic0", "node0000/nic1"}
    incoming = {f.id for f in plan.flows if f.dst.startswith("node0000/")}
    assert {x["id"] for lis in a0["listen"] for x in lis["flows"]} == incoming
    assert a0["start_at"] == 1000.0 and a0["run"] == 9
    del addrs["node0003/nic1"]
    with pytest.raises(PlanError, match="node0003/nic1"):
        agent_args(plan, topo, addrs, run=9, start_at=1000.0, duration_s=5, rate_mbit=20)


def test_results_merge_into_observation_windows_per_directed_pair():
    topo = parse_topology(FABRICS["2-tier rail2 su2"])
    plan = plan_traffic(topo, flows_per_nic=2, ports_per_pair=1)
    pairs = sorted({(f.src, f.dst) for f in plan.flows})
    lossy = pairs[0]
    results: dict[str, dict] = {}
    for f in plan.flows:
        res = results.setdefault(topo.nic(f.src).host, {"protocol": "udp", "windows": 2, "window_s": 1.0, "tx": [],
                                                         "rx": []})
        res["tx"].append({"flow": f.id, "src": f.src, "dst": f.dst, "sent": [100, 100], "bytes": [140000, 140000],
                          "skipped": 0})
    for src, dst in pairs:
        n = sum(1 for f in plan.flows if (f.src, f.dst) == (src, dst))
        got = [100 * n - 30, 100 * n] if (src, dst) == lossy else [100 * n, 100 * n]
        res = results.setdefault(topo.nic(dst).host, {"protocol": "udp", "windows": 2, "window_s": 1.0, "tx": [],
                                                       "rx": []})
        res["rx"].append({"nic": dst, "src": src, "received": got, "bytes": [g * 1400 for g in got],
                          "owd_us": [{"p50": 30.0, "p99": 80.0, "max": 90.0}, {"p50": 40.0, "p99": 60.0, "max": 70.0}]})
    merged = observations(plan, results)
    assert merged["missing"] == []
    w0 = {(p["src"], p["dst"]): p for p in merged["windows"][0]["probes"]}
    assert merged["windows"][0]["format"] == "lockstep.observations/v1" and merged["windows"][0]["window_s"] == 1.0
    assert w0[lossy]["lost"] == 30 and w0[lossy]["owd_us"] == {"p50": 30.0, "p99": 80.0}
    assert all(p["lost"] == 0 for k, p in w0.items() if k != lossy)
    total = {(p["src"], p["dst"]): p for p in merged["total"]["probes"]}
    assert total[lossy]["sent"] == 200 * total[lossy]["flows"] and total[lossy]["lost"] == 30
    assert total[lossy]["owd_us"] == {"p50": 35.0, "p99": 80.0}
    assert merged["total"]["window_s"] == 2.0
    # an agent that did not answer: its pairs are missing, not lost
    gone = topo.nic(pairs[-1][1]).host
    del results[gone]
    merged = observations(plan, results)
    assert merged["missing"] and all(m["missing"] in ("sender", "receiver") for m in merged["missing"])
    assert all(topo.nic(p["dst"]).host != gone and topo.nic(p["src"]).host != gone
               for p in merged["total"]["probes"])


def _window(*probes):
    return {"format": "lockstep.observations/v1", "topology": "t", "window_s": 1.0, "probes": list(probes)}


def _probe(src, dst, sent, lost, p50=50, p99=90):
    return {"src": src, "dst": dst, "sent": sent, "lost": lost, "owd_us": {"p50": p50, "p99": p99},
            "bytes": (sent - lost) * 1000, "throughput_mbit": 0.0, "offered_mbit": 8.0, "flows": 2}


def test_measured_windows_add_counts_over_the_windows_both_ends_loaded():
    from workers.trafficplan.windows import combine_measured

    one = _window(_probe("a/n0", "b/n0", 1000, 0, 50, 90), _probe("b/n0", "a/n0", 1000, 10, 60, 80))
    two = _window(_probe("a/n0", "b/n0", 1000, 20, 70, 300), _probe("b/n0", "a/n0", 1000, 0, 60, 80))
    doc, unmeasured = combine_measured([one, two], {}, min_windows=2)
    assert unmeasured == [] and doc["window_s"] == 2.0
    p = next(p for p in doc["probes"] if p["src"] == "a/n0")
    assert (p["sent"], p["lost"], p["owd_us"]) == (2000, 20, {"p50": 60.0, "p99": 300})
    assert p["throughput_mbit"] == round(1980 * 1000 * 8 / 2 / 1e6, 3)
    assert combine_measured([], {}, min_windows=1) == (None, [])


def test_a_late_agent_costs_only_its_own_pairs_windows_and_too_late_is_not_measured():
    from workers.trafficplan.windows import combine_measured

    # c/n0's agent started in window 2: its pairs lost everything before (nobody listening, nothing sent)
    windows = [_window(_probe("a/n0", "b/n0", 100, 0), _probe("a/n0", "c/n0", 100, 100), _probe("c/n0", "a/n0", 0, 0))
               for _ in range(2)]
    windows += [_window(_probe("a/n0", "b/n0", 100, 0), _probe("a/n0", "c/n0", 100, 0), _probe("c/n0", "a/n0", 100, 1))
                for _ in range(3)]
    doc, unmeasured = combine_measured(windows, {"c/n0": 2}, min_windows=3)
    by_pair = {(p["src"], p["dst"]): p for p in doc["probes"]}
    assert unmeasured == [] and doc["window_s"] == 5.0
    assert by_pair[("a/n0", "b/n0")]["sent"] == 500  # every window: its ends were on time
    assert (by_pair[("a/n0", "c/n0")]["sent"], by_pair[("a/n0", "c/n0")]["lost"]) == (300, 0)  # not lost: late
    assert by_pair[("c/n0", "a/n0")]["lost"] == 3
    # later than the measured span allows: its pairs are not measured, never passed
    doc, unmeasured = combine_measured(windows, {"c/n0": 3}, min_windows=3)
    assert {(p["src"], p["dst"]) for p in doc["probes"]} == {("a/n0", "b/n0")}
    assert unmeasured == [{"src": "a/n0", "dst": "c/n0", "missing": "late", "windows": 2},
                          {"src": "c/n0", "dst": "a/n0", "missing": "late", "windows": 2}]
    assert combine_measured(windows, {"a/n0": 9}, min_windows=1)[0] is None
