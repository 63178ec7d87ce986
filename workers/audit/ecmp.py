"""Is every leaf spreading its flows over its uplinks? The audit's ECMP check. Pure.

A switch with ECMP hashing off sends every flow to other leaves by one uplink: nothing is lost
until that uplink fills, so loss alone cannot see it on a lightly loaded fabric. Path evidence
can: before the load each agent sends every flow's own 5-tuple once with TTL 2
(``agent.audit.loadgen``), and the switch after the flow's leaf answers from the port it arrived
on — the address names the uplink the flow left by. A leaf with ``u`` equal uplinks that hashes
``k`` distinct flows to other leaves puts them all on one uplink with probability ``u**(1 - k)``;
when every traced flow of a leaf left by one uplink and that probability is at most ``ALPHA``,
the leaf is the culprit (its hashing, not a cable: the cables carry what they are given).

A leaf with too few traced flows to tell is reported as such (``undecided``), never passed on
that evidence alone. A leaf whose uplinks are down but one (routes withdrawn) looks the same:
the check names the switch, and its links' own state tells the operator which it is.
"""

from __future__ import annotations

from collections import Counter

from workers.fabric.topology import Topology

ALPHA = 1e-3
TRACE_TTL = 2  # the hop after a host's first switch: a leaf's uplink
TRACE_EXTRA = 3  # more tuples per flow: a small leaf's few flows still tell hashing from none


def _access_switch(topology: Topology) -> dict[str, str]:
    """NIC -> the one switch it is cabled to (multi-homed NICs are left out: no single leaf)."""
    ends: dict[str, list[str]] = {}
    for link in topology.links:
        for nic, other in ((link.a, link.b), (link.b, link.a)):
            if topology.is_nic(nic) and topology.is_switch(other):
                ends.setdefault(nic, []).append(other)
    return {nic: sw[0] for nic, sw in ends.items() if len(sw) == 1}


def _uplinks(topology: Topology) -> dict[str, int]:
    """Switch -> how many links it has to other switches."""
    out: Counter = Counter()
    for link in topology.links:
        if topology.is_switch(link.a) and topology.is_switch(link.b):
            out[link.a] += 1
            out[link.b] += 1
    return dict(out)


def check(topology: Topology, flows: list[dict], traces: list[dict], addresses: dict[str, str]) -> list[dict]:
    """One entry per leaf that sent traced flows to other leaves.

    ``flows``: ``{"id", "src", "dst"}`` (NIC names) of the plan; ``traces``: the agents' traces
    (``{"flow", "sport", "hop", "answer"}``, several tuples per flow); ``addresses``: NIC -> its
    address (an answer from the flow's destination is not a switch). Each entry: ``{"switch",
    "status": "pass" | "fail" | "undecided", "uplinks", "flows": traced tuples, "hops": {address:
    tuples}, "p_one_uplink"}``.
    """
    leaf_of = _access_switch(topology)
    uplinks = _uplinks(topology)
    by_id = {f["id"]: f for f in flows}
    hops: dict[str, Counter] = {}
    seen_tuples: set[tuple] = set()
    for trace in traces:
        f = by_id.get(trace.get("flow"))
        if f is None:
            continue
        src_leaf, dst_leaf = leaf_of.get(f["src"]), leaf_of.get(f["dst"])
        if src_leaf is None or dst_leaf is None or src_leaf == dst_leaf:
            continue
        if trace.get("answer") != "ttl" or not trace.get("hop") or trace["hop"] == addresses.get(f["dst"]):
            continue
        key = (f["src"], f["dst"], trace.get("sport"))
        if key in seen_tuples:  # the same 5-tuple twice hashes the same: one piece of evidence
            continue
        seen_tuples.add(key)
        hops.setdefault(src_leaf, Counter())[trace["hop"]] += 1
    out = []
    for leaf in sorted(hops):
        u, seen = uplinks.get(leaf, 0), hops[leaf]
        k = sum(seen.values())
        if u < 2:
            continue  # one uplink: nothing to spread over
        p_one = float(u) ** (1 - k)
        if len(seen) > 1:
            status = "pass"
        elif p_one <= ALPHA:
            status = "fail"
        else:
            status = "undecided"
        out.append({"switch": leaf, "status": status, "uplinks": u, "flows": k, "hops": dict(sorted(seen.items())),
                    "p_one_uplink": round(p_one, 6)})
    return out
