"""The audit's ECMP check (workers.audit.ecmp): a leaf whose traced flows to other leaves all left by
one uplink is the culprit; a spread leaf passes; too few flows is undecided, never a pass."""

from __future__ import annotations

import random

from testbed import generate
from workers.audit.ecmp import ALPHA, check
from workers.audit.verdict import compose
from workers.fabric.topology import parse_topology
from workers.trafficplan.plan import plan_traffic

TOPOLOGY = parse_topology(generate(hosts=4, rails=1, hosts_per_leaf=2, spines=2))  # 2 leaves, 2 spines
PLAN = plan_traffic(TOPOLOGY, flows_per_nic=8, ports_per_pair=2)
FLOWS = [{"id": f.id, "src": f.src, "dst": f.dst} for f in PLAN.flows]
ADDRESSES = {n.name: f"10.0.0.{i + 1}" for i, n in enumerate(TOPOLOGY.nics)}


def _leaf(nic: str) -> str:
    return next(lk.b if lk.a == nic else lk.a for lk in TOPOLOGY.links if nic in (lk.a, lk.b))


def _src_leaf(trace: dict) -> str:
    return _leaf(next(f.src for f in PLAN.flows if f.id == trace["flow"]))


def _traces(one_uplink: set[str], per_flow: int = 4, seed: int = 3) -> list[dict]:
    """Each flow traced from `per_flow` source ports; a leaf in `one_uplink` answers from one spine port."""
    rng = random.Random(seed)
    out = []
    for f in PLAN.flows:
        leaf = _leaf(f.src)
        for j in range(per_flow):
            if leaf == _leaf(f.dst):  # TTL 2 reaches the destination host: no switch answers
                out.append({"flow": f.id, "sport": 40000 + 10 * f.id + j, "hop": ADDRESSES[f.dst], "answer": "unreach"})
                continue
            spine = 0 if leaf in one_uplink else rng.randrange(2)
            out.append({"flow": f.id, "sport": 40000 + 10 * f.id + j, "hop": f"10.9.{spine}.{leaf[-1]}", "answer": "ttl"})
    return out


def test_spread_leaves_pass_and_a_leaf_on_one_uplink_is_the_culprit():
    leaves = sorted({_leaf(f.src) for f in PLAN.flows})
    healthy = check(TOPOLOGY, FLOWS, _traces(set()), ADDRESSES)
    assert [e["switch"] for e in healthy] == leaves and {e["status"] for e in healthy} == {"pass"}
    assert all(len(e["hops"]) == 2 and e["uplinks"] == 2 for e in healthy)
    bad = {e["switch"]: e for e in check(TOPOLOGY, FLOWS, _traces({leaves[0]}), ADDRESSES)}
    assert bad[leaves[0]]["status"] == "fail" and bad[leaves[0]]["p_one_uplink"] <= ALPHA
    assert len(bad[leaves[0]]["hops"]) == 1 and bad[leaves[1]]["status"] == "pass"
    # same-leaf flows (answered by their destination) are no evidence either way
    assert bad[leaves[0]]["flows"] == sum(1 for t in _traces(set()) if t["answer"] == "ttl"
                                          and _src_leaf(t) == leaves[0])


def test_too_few_traced_flows_are_undecided_and_the_same_tuple_counts_once():
    leaves = sorted({_leaf(f.src) for f in PLAN.flows})
    few = [t for t in _traces({leaves[0]}, per_flow=1) if t["answer"] == "ttl" and _src_leaf(t) == leaves[0]][:5]
    [entry] = check(TOPOLOGY, FLOWS, few, ADDRESSES)
    assert entry["status"] == "undecided" and entry["p_one_uplink"] == 2.0 ** -4
    assert check(TOPOLOGY, FLOWS, few * 10, ADDRESSES) == [entry]


def test_a_failed_leaf_is_a_switch_culprit_in_the_verdict_and_undecided_only_a_warning():
    leaves = sorted({_leaf(f.src) for f in PLAN.flows})
    spread = check(TOPOLOGY, FLOWS, _traces({leaves[0]}), ADDRESSES)
    doc = compose({}, fabric={"culprits": [], "pairs": [], "missing": [], "ecmp": spread})
    assert doc["status"] == "fail" and [(c["kind"], c["name"]) for c in doc["culprits"]] == [("switch", leaves[0])]
    [finding] = [f for f in doc["findings"] if f["check"] == "fabric.ecmp"]
    assert finding["code"] == "LOCKSTEP_FR_ECMP_ONE_UPLINK" and finding["evidence"]["uplinks"] == 2
    few = [t for t in _traces({leaves[0]}, per_flow=1) if t["answer"] == "ttl" and _src_leaf(t) == leaves[0]][:5]
    doc = compose({}, fabric={"culprits": [], "pairs": [], "missing": [], "ecmp": check(TOPOLOGY, FLOWS, few, ADDRESSES)})
    assert doc["status"] == "warn" and doc["culprits"] == []
