"""Which peers each NIC probes: the same-leaf mesh, the other NICs of its host, and a sample of
NICs on other leaves, chosen by rendezvous hashing so the plan is deterministic for a seed and
stable when membership changes.

Pure: a `Topology` (and the set of NICs taking part) in, a `ProbePlan` out.

For NIC s on leaf a (its root switch) and host H:

1. **same-leaf mesh**: every other member NIC on leaf a (at most `max_same_leaf`, the
   highest-scoring ones when a leaf is larger). One hop through a leaf: it separates a NIC from
   its leaf and from the fabric above.
2. **same host** (Hostmesh): the other member NICs of host H. On rail-optimized fabrics these
   cross the spines; they separate a NIC from its host.
3. **cross-leaf sample**: `cross_leaf` NICs on other leaves: the leaves with the highest scores
   h(seed, s, leaf), one NIC each, the one with the highest h(seed, s, nic). With even ECMP
   spreading these cover every uplink, spine and core.
4. **repair**: any switch-switch link direction or switch still covered less than `coverage`
   times (the sum over the plan's pairs of the share of the pair's paths through it) gets
   extra pairs from the leaf pairs whose paths cross it most.

Scores are keyed hashes (blake2b of the seed and the names), so the plan depends on names, not
on list order; a NIC joining or leaving changes only the choices it wins or held (rendezvous
hashing): every other NIC keeps its peers.

Coverage and identifiability (`coverage_report`, `ambiguous_groups`): coverage of an element is
the number of plan pairs' worth of probes crossing it (each direction of a link separately);
the plan asks for at least `coverage` everywhere. Identifiability is deTector's
1-identifiability: a single faulty element is identifiable when no other element has the same
incidence vector over the plan's pairs (per direction, ECMP fractions for unknown paths). Some
elements can never be told apart by end-to-end probes, whatever the plan: a single-homed NIC and
its access link (named as the NIC), and, without known paths, links that every pair crosses in
the same share (parallel links, a leaf's uplinks in a two-tier Clos); path discovery (observations
with `path`) separates those. The criterion checked in the tests: the plan's ambiguity groups
are exactly those of the full mesh (probing every pair), i.e. the plan gives up no
identifiability that probing could give.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from workers.fabric.paths import PathIndex
from workers.fabric.topology import Topology

DEFAULT_CROSS_LEAF = 8
DEFAULT_COVERAGE = 3.0


def _score(seed: int, *parts: str) -> int:
    h = hashlib.blake2b(("\x1f".join((str(seed),) + parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def _name_hash(names: Iterable[str]) -> np.ndarray:
    return np.array([_score(0, "name", n) for n in names], dtype=np.uint64)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast, well-spread 64-bit hash of 64-bit keys (vectorized)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def _pair_scores(key: np.uint64, a: np.uint64, b: np.ndarray) -> np.ndarray:
    """Score of (a, b) under a keyed hash: depends on the names only, not on list order."""
    return _mix(b ^ _mix(np.uint64(a) ^ key))


@dataclass(frozen=True)
class ProbePlan:
    """peers[nic] = the NICs it probes, in a stable order (by kind, then name)."""

    seed: int
    peers: dict[str, tuple[str, ...]]
    members: frozenset[str]
    stats: dict = field(default_factory=dict, compare=False)

    def pairs(self) -> list[tuple[str, str]]:
        return [(s, d) for s, ds in self.peers.items() for d in ds]

    def size(self, nic: str) -> int:
        return len(self.peers.get(nic, ()))

    def sizes(self) -> dict[str, float]:
        n = np.array([len(v) for v in self.peers.values()] or [0])
        return {"mean": float(n.mean()), "min": int(n.min()), "max": int(n.max()), "total_pairs": int(n.sum())}

    def to_document(self) -> dict:
        return {"format": "lockstep.probe-plan/v1", "seed": self.seed,
                "peers": {s: list(ds) for s, ds in sorted(self.peers.items())}}


def plan_probes(topology: Topology | PathIndex, seed: int = 0, members: Iterable[str] | None = None,
                cross_leaf: int = DEFAULT_CROSS_LEAF, max_same_leaf: int | None = None,
                coverage: float = DEFAULT_COVERAGE, repair: bool = True) -> ProbePlan:
    """The probe plan of a topology for the member NICs (default: every NIC)."""
    index = topology if isinstance(topology, PathIndex) else PathIndex(topology)
    topo = index.topology
    all_nics = index.nic_names
    member = frozenset(all_nics if members is None else members)
    unknown = sorted(member - set(all_nics))
    if unknown:
        raise KeyError(f"{unknown[0]!r} is not a NIC of topology {topo.name!r}")
    # the leaf of a NIC: its single switch, or for a multi-homed NIC its first attachment
    leaf: dict[str, str] = {}
    for i, name in enumerate(all_nics):
        att = index._attach[i]
        if att:
            leaf[name] = index.switch_names[min(att, key=lambda a: index.switch_names[a[1]])[1]]
        elif index._direct[i]:
            leaf[name] = f"direct:{name}"
    by_leaf: dict[str, list[str]] = {}
    for name in sorted(member):
        if name in leaf:
            by_leaf.setdefault(leaf[name], []).append(name)
    by_host: dict[str, list[str]] = {}
    for nic in topo.nics:
        if nic.name in member:
            by_host.setdefault(nic.host, []).append(nic.name)
    host_of = {nic.name: nic.host for nic in topo.nics}
    leaves = sorted(by_leaf)
    leaf_h = _name_hash(leaves)
    nic_h = dict(zip(sorted(member), _name_hash(sorted(member)).tolist(), strict=True))
    leaf_members = {b: (ns, np.array([nic_h[n] for n in ns], dtype=np.uint64)) for b, ns in by_leaf.items()}
    k_same = np.uint64(_score(seed, "same-leaf"))
    k_to = np.uint64(_score(seed, "to-leaf"))
    k_peer = np.uint64(_score(seed, "peer"))

    peers: dict[str, list[str]] = {}
    for s in sorted(member):
        hs = np.uint64(nic_h[s])
        mine: list[str] = []
        a = leaf.get(s)
        same_names, same_h = leaf_members.get(a, ([], np.zeros(0, dtype=np.uint64)))
        same = [d for d in same_names if d != s]
        if max_same_leaf is not None and len(same) > max_same_leaf:
            sc = _pair_scores(k_same, hs, np.array([nic_h[d] for d in same], dtype=np.uint64))
            same = [same[i] for i in np.argsort(-sc.astype(np.float64), kind="stable")[:max_same_leaf]]
        mine += sorted(same)
        mine += sorted(d for d in by_host.get(host_of[s], []) if d != s and d not in mine)
        taken = set(mine) | {s}
        chosen: list[str] = []
        if cross_leaf > 0 and len(leaves) > 1:
            order = np.argsort(_pair_scores(k_to, hs, leaf_h), kind="stable")[::-1]
            for bi in order:
                b = leaves[bi]
                if b == a:
                    continue
                names, hashes = leaf_members[b]
                sc = _pair_scores(k_peer, hs, hashes)
                for j in np.argsort(sc, kind="stable")[::-1]:
                    if names[j] not in taken:
                        chosen.append(names[j])
                        taken.add(names[j])
                        break
                if len(chosen) >= cross_leaf:
                    break
        mine += sorted(chosen)
        peers[s] = mine
    added = _repair(index, peers, member, leaf, by_leaf, seed, coverage) if repair and len(leaves) > 1 else 0
    plan = ProbePlan(seed, {s: tuple(v) for s, v in peers.items()}, member)
    plan.stats["repair_pairs"] = added
    return plan


def _coverage(index: PathIndex, pairs: list[tuple[str, str]]):
    """(link a->b, link b->a, switch) coverage of the pairs: sums of ECMP shares."""
    inc = index.incidence(pairs)
    return inc.loads()


def _repair(index: PathIndex, peers: dict[str, list[str]], member, leaf, by_leaf, seed: int, need: float) -> int:
    """Add pairs until every switch-switch link direction and switch that some member pair can
    cross is covered `need` times; returns the number of pairs added."""
    pairs = [(s, d) for s, ds in peers.items() for d in ds]
    if not pairs:
        return 0
    fwd, rev, sw = _coverage(index, pairs)
    inner = index.link_kind == 0
    # what could be covered at all: one member NIC per leaf, every leaf pair
    reps = {b: ns[0] for b, ns in by_leaf.items() if not b.startswith("direct:")}
    names = sorted(reps)
    every = [(reps[a], reps[b]) for a in names for b in names if a != b]
    if not every:
        return 0
    inc_all = index.incidence(every)
    cf, cr, cs = inc_all.loads()
    lacking = [("link", k, True) for k in np.flatnonzero(inner & (fwd < need) & (cf > 0))]
    lacking += [("link", k, False) for k in np.flatnonzero(inner & (rev < need) & (cr > 0))]
    lacking += [("switch", s, None) for s in np.flatnonzero((sw < need) & (cs > 0))]
    added = 0
    for kind, k, forward in lacking:
        have = (fwd[k] if forward else rev[k]) if kind == "link" else sw[k]
        if kind == "link":
            r, _, v = inc_all.fraction_entries(np.array([k]), np.array([forward]), np.zeros(0, dtype=np.int64))
        else:
            r, _, v = inc_all.fraction_entries(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool), np.array([k]))
        share = np.bincount(r, weights=v, minlength=len(every))
        order = np.lexsort((np.array([-(_score(seed, "repair", *every[i]) % 1000) for i in range(len(every))]),
                            -share))
        for i in order:
            if have >= need or share[i] <= 0:
                break
            a, b = leaf[every[i][0]], leaf[every[i][1]]
            srcs = sorted(by_leaf[a], key=lambda n: -_score(seed, "rs", n, str(k)))
            for s in srcs:
                dsts = [d for d in sorted(by_leaf[b], key=lambda n: -_score(seed, "rd", s, n)) if d not in peers[s]]
                if dsts:
                    peers[s].append(dsts[0])
                    have += share[i]
                    added += 1
                    break
    return added


def coverage_report(index: PathIndex, plan: ProbePlan) -> dict[str, float]:
    """Smallest coverage per element kind (pairs' worth of probes, ECMP shares)."""
    fwd, rev, sw = _coverage(index, plan.pairs())
    inner = index.link_kind == 0
    nic_tx = {s: len(ds) for s, ds in plan.peers.items()}
    nic_rx: dict[str, int] = {}
    for _s, ds in plan.peers.items():
        for d in ds:
            nic_rx[d] = nic_rx.get(d, 0) + 1
    used_sw = sw[sw > 0]
    return {
        "link_direction_min": float(min(fwd[inner].min(initial=np.inf), rev[inner].min(initial=np.inf))),
        "switch_min": float(used_sw.min()) if used_sw.size else 0.0,
        "nic_tx_min": float(min(nic_tx.values(), default=0)),
        "nic_rx_min": float(min(nic_rx.values(), default=0)),
    }


def ambiguous_groups(index: PathIndex, pairs: list[tuple[str, str]], seed: int = 0) -> list[tuple[str, ...]]:
    """Groups of elements that the pairs' probes cannot tell apart (ECMP shares, unknown paths):
    link directions `L (a->b)`, switches, NICs (tx+rx) and hosts with equal incidence vectors.
    A NIC and its single access link (both directions) count as one element and are not listed."""
    rng = np.random.default_rng(seed)
    inc = index.incidence(pairs)
    w = rng.random((len(pairs), 3)) + 0.5
    fwd, rev, sw = inc.loads(w)
    N, H = len(index.nic_names), len(index.host_names)
    src, dst = inc.src, inc.dst
    nic_tx = np.stack([np.bincount(src, w[:, c], N) for c in range(3)], axis=1)
    nic_rx = np.stack([np.bincount(dst, w[:, c], N) for c in range(3)], axis=1)
    hs, hd = index.nic_host[src], index.nic_host[dst]
    host = np.stack([np.bincount(hs, w[:, c], H) + np.bincount(hd, w[:, c], H) for c in range(3)], axis=1)
    access = {int(k) for k in index.nic_access if k >= 0}
    labels, rows = [], []
    for k, lid in enumerate(index.link_ids):
        if k in access:
            continue
        a, b = index.link_a[k], index.link_b[k]
        labels += [f"{lid} ({a}->{b})", f"{lid} ({b}->{a})"]
        rows += [fwd[k], rev[k]]
    labels += list(index.switch_names)
    rows += list(sw)
    labels += [f"{n} tx" for n in index.nic_names] + [f"{n} rx" for n in index.nic_names]
    rows += list(nic_tx) + list(nic_rx)
    labels += list(index.host_names)
    rows += list(host)
    table = np.round(np.array(rows) / max(float(np.abs(np.array(rows)).max()), 1e-300), 9)
    groups: dict[bytes, list[str]] = {}
    for lab, row in zip(labels, table, strict=True):
        if not row.any():
            continue  # not probed at all
        groups.setdefault(row.tobytes(), []).append(lab)
    return sorted(tuple(sorted(g)) for g in groups.values() if len(g) > 1)
