"""The traffic plan: NIC pairs and source ports that load every link in both directions at once.

Pure: a `Topology` in, a plan out (no I/O, no clock). Used by the audit to drive the load
generator (the agents' ``audit.load`` command) on every NIC at the same time.

Model. A flow is one (source NIC, destination NIC, source port) triple; a switch hashes each
flow's 5-tuple onto one of its equal-cost next hops (ECMP), so which path a flow takes is not
known in advance. Under even hashing a flow of pair p crosses directed link d with probability
f_p(d), the fraction of p's ECMP paths through d (`workers.fabric.paths`), and independent
flows miss d with probability prod_p (1 - f_p(d))^m_p <= exp(-E_d), where E_d = sum m_p f_p(d)
is the expected number of flows on d. The plan makes E_d >= ln(1/epsilon) on every directed
link that any NIC pair's shortest paths can cross, so each such link carries at least one flow
with probability >= 1 - epsilon even though the hash is unknown; parallel uplinks are distinct
links and are covered the same way.

Construction. Flows come in rounds: a round is a permutation of the NICs (every NIC sends one
pair and receives one pair, never to its own host), each pair with `ports_per_pair` source
ports, so every NIC sends and receives exactly ``rounds x ports_per_pair`` flows, bounded by
`flows_per_nic`. Candidate rounds are shifts of the NIC order (same rail to other hosts, other
rails, far hosts) and seeded random derangements; each step keeps the candidate that lowers the
coverage deficit sum_d max(0, target - E_d) the most, until no covered link is short or the
budget is spent. Directed links no NIC pair can cross (a switch hanging off the fabric) are
reported as `uncoverable`, links left below the target as `below_target`: never silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from workers.fabric.paths import PathIndex
from workers.fabric.topology import Topology

FORMAT = "lockstep.trafficplan/v1"
DEFAULT_SPORT_BASE = 40000
DEFAULT_DPORT = 47000


class PlanError(ValueError):
    """The plan cannot be made as asked; the message says why."""


@dataclass(frozen=True)
class Flow:
    id: int
    src: str  # NIC
    dst: str  # NIC
    sport: int


@dataclass
class TrafficPlan:
    topology: str
    flows: list[Flow]
    flows_per_nic: int
    ports_per_pair: int
    epsilon: float
    target: float  # expected flows per directed link: ln(1/epsilon)
    link_ids: tuple[str, ...]
    expected_fwd: np.ndarray  # per link (a->b): expected flows E_d
    expected_rev: np.ndarray  # per link (b->a)
    coverable_fwd: np.ndarray  # bool per link: some NIC pair can cross it a->b
    coverable_rev: np.ndarray
    dport: int = DEFAULT_DPORT
    rounds: list[list[tuple[str, str]]] = field(default_factory=list)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [p for r in self.rounds for p in r]

    def below_target(self) -> list[tuple[str, str]]:
        """(link id, "a>b"|"b>a") coverable but expected to carry fewer than `target` flows."""
        out = []
        for i, lid in enumerate(self.link_ids):
            if self.coverable_fwd[i] and self.expected_fwd[i] < self.target - 1e-9:
                out.append((lid, "a>b"))
            if self.coverable_rev[i] and self.expected_rev[i] < self.target - 1e-9:
                out.append((lid, "b>a"))
        return out

    def uncoverable(self) -> list[tuple[str, str]]:
        out = []
        for i, lid in enumerate(self.link_ids):
            if not self.coverable_fwd[i]:
                out.append((lid, "a>b"))
            if not self.coverable_rev[i]:
                out.append((lid, "b>a"))
        return out

    def miss_probability_bound(self) -> float:
        """Upper bound on the chance that some coverable directed link carries no flow (union bound)."""
        e = np.concatenate((self.expected_fwd[self.coverable_fwd], self.expected_rev[self.coverable_rev]))
        return float(min(1.0, np.exp(-e).sum())) if e.size else 0.0

    def flows_per_nic_count(self) -> dict[str, tuple[int, int]]:
        """NIC -> (flows sent, flows received)."""
        out: dict[str, list[int]] = {}
        for f in self.flows:
            out.setdefault(f.src, [0, 0])[0] += 1
            out.setdefault(f.dst, [0, 0])[1] += 1
        return {k: (v[0], v[1]) for k, v in out.items()}

    def to_document(self) -> dict:
        return {
            "format": FORMAT,
            "topology": self.topology,
            "flows_per_nic": self.flows_per_nic,
            "ports_per_pair": self.ports_per_pair,
            "dport": self.dport,
            "epsilon": self.epsilon,
            "target_flows_per_link": round(self.target, 4),
            "flows": [{"id": f.id, "src": f.src, "dst": f.dst, "sport": f.sport} for f in self.flows],
            "coverage": {
                "links": [{"id": lid, "a>b": round(float(self.expected_fwd[i]), 4),
                           "b>a": round(float(self.expected_rev[i]), 4)} for i, lid in enumerate(self.link_ids)],
                "below_target": [{"link": lid, "direction": d} for lid, d in self.below_target()],
                "uncoverable": [{"link": lid, "direction": d} for lid, d in self.uncoverable()],
                "miss_probability_bound": self.miss_probability_bound(),
            },
        }


def _coverable(index: PathIndex, topology: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Which directed links some NIC pair (of different hosts) can cross on a shortest path.

    Two representatives per attachment switch (NICs of different hosts where possible) and
    every representative pair of different hosts: any switch-to-switch segment a pair can use
    is used by the representatives of its two end switches.
    """
    reps: dict[str, list[str]] = {}
    attach: dict[str, str] = {}
    for link in topology.links:
        a_nic, b_nic = topology.is_nic(link.a), topology.is_nic(link.b)
        if a_nic != b_nic:
            attach.setdefault(link.a if a_nic else link.b, link.b if a_nic else link.a)
    for nic in topology.nics:
        sw = attach.get(nic.name)
        if sw is None:
            continue
        chosen = reps.setdefault(sw, [])
        if len(chosen) < 2 and all(topology.nic(c).host != nic.host for c in chosen):
            chosen.append(nic.name)
    candidates = [n for group in reps.values() for n in group]
    pairs = [(s, d) for s in candidates for d in candidates
             if s != d and topology.nic(s).host != topology.nic(d).host]
    # NICs cabled directly to each other (no switch) are their own pairs
    for link in topology.links:
        if topology.is_nic(link.a) and topology.is_nic(link.b) and \
                topology.nic(link.a).host != topology.nic(link.b).host:
            pairs += [(link.a, link.b), (link.b, link.a)]
    fwd = np.zeros(len(index.link_ids), dtype=bool)
    rev = np.zeros(len(index.link_ids), dtype=bool)
    if pairs:
        inc = index.incidence(pairs)
        keep = np.flatnonzero(inc.reachable)
        if keep.size < len(pairs):
            inc = index.incidence([pairs[i] for i in keep])
        if keep.size:
            f, r = inc.link_loads()
            fwd |= f > 1e-12
            rev |= r > 1e-12
    # a NIC's access link is crossed both ways as soon as the NIC reaches a NIC of another host
    for link in topology.links:
        a_nic, b_nic = topology.is_nic(link.a), topology.is_nic(link.b)
        if a_nic == b_nic:
            continue
        nic = link.a if a_nic else link.b
        host = topology.nic(nic).host
        if any(topology.nic(c).host != host and index.hop_count(nic, c) is not None for c in candidates):
            k = index.link_index[link.id]
            fwd[k] = rev[k] = True
    return fwd, rev


def _derangement(n_nics: int, hosts: np.ndarray, rng: np.random.Generator, tries: int = 50) -> np.ndarray | None:
    """A random permutation sending no NIC to its own host (None when none was found)."""
    for _ in range(tries):
        perm = rng.permutation(n_nics)
        bad = np.flatnonzero(hosts[perm] == hosts)
        for i in bad:  # repair by swapping with a random position that keeps both valid
            for j in rng.permutation(n_nics):
                if hosts[perm[j]] != hosts[i] and hosts[perm[i]] != hosts[j]:
                    perm[i], perm[j] = perm[j], perm[i]
                    break
        if not np.any(hosts[perm] == hosts):
            return perm
    return None


def plan_traffic(topology: Topology, *, flows_per_nic: int = 16, ports_per_pair: int = 2, epsilon: float = 1e-3,
                 candidates: int = 24, seed: int = 0, sport_base: int = DEFAULT_SPORT_BASE,
                 dport: int = DEFAULT_DPORT) -> TrafficPlan:
    """The plan for `topology` (see the module docstring); deterministic for a given `seed`."""
    if not isinstance(flows_per_nic, int) or flows_per_nic < 1:
        raise PlanError(f"flows_per_nic must be a positive integer, got {flows_per_nic!r}")
    if not isinstance(ports_per_pair, int) or not 1 <= ports_per_pair <= flows_per_nic:
        raise PlanError(f"ports_per_pair must be between 1 and flows_per_nic ({flows_per_nic}), got {ports_per_pair!r}")
    if not 0.0 < epsilon < 1.0:
        raise PlanError(f"epsilon must be a probability strictly between 0 and 1, got {epsilon!r}")
    if not 1024 <= sport_base <= 65535 - flows_per_nic:
        raise PlanError(f"sport_base {sport_base}: flows use ports sport_base .. sport_base + flows_per_nic - 1")
    index = PathIndex(topology)
    nics = list(index.nic_names)
    n = len(nics)
    hosts = np.array([index.host_index[topology.nic(x).host] for x in nics], dtype=np.int64)
    if len(set(hosts.tolist())) < 2:
        raise PlanError("a traffic plan needs NICs on at least two hosts")
    target = math.log(1.0 / epsilon)
    cov_fwd, cov_rev = _coverable(index, topology)
    exp_fwd = np.zeros(len(index.link_ids))
    exp_rev = np.zeros(len(index.link_ids))
    rng = np.random.default_rng(seed)
    max_rounds = flows_per_nic // ports_per_pair
    rounds: list[list[tuple[str, str]]] = []
    used: set[tuple[str, str]] = set()

    def deficit(f: np.ndarray, r: np.ndarray) -> float:
        return float(np.maximum(0.0, target - f)[cov_fwd].sum() + np.maximum(0.0, target - r)[cov_rev].sum())

    shifts = [s for s in range(1, n) if not np.any(hosts[(np.arange(n) + s) % n] == hosts)]

    def candidate_perms() -> list[np.ndarray]:
        perms = []
        if shifts:
            take = rng.choice(len(shifts), size=min(len(shifts), candidates // 2), replace=False)
            perms += [(np.arange(n) + shifts[int(k)]) % n for k in sorted(take)]
        while len(perms) < candidates:
            perm = _derangement(n, hosts, rng)
            if perm is None:
                break
            perms.append(perm)
        return perms

    for _ in range(max_rounds):
        current = deficit(exp_fwd, exp_rev)
        if current <= 1e-9:
            break
        best = None
        for perm in candidate_perms():
            pairs = [(nics[i], nics[int(perm[i])]) for i in range(n)]
            inc = index.incidence(pairs)
            if not inc.reachable.all():
                # unreachable pairs (separate fabrics) carry nothing: skip them in this round
                pairs = [p for p, ok in zip(pairs, inc.reachable, strict=True) if ok]
                if not pairs:
                    continue
                inc = index.incidence(pairs)
            fwd, rev = inc.link_loads()
            fwd, rev = fwd * ports_per_pair, rev * ports_per_pair
            repeats = sum(1 for p in pairs if p in used)
            score = current - deficit(exp_fwd + fwd, exp_rev + rev)
            key = (score, -repeats)
            if best is None or key > best[0]:
                best = (key, pairs, fwd, rev)
        if best is None or best[0][0] <= 1e-9:
            break
        _, pairs, fwd, rev = best
        exp_fwd += fwd
        exp_rev += rev
        rounds.append(pairs)
        used.update(pairs)
    flows: list[Flow] = []
    next_port: dict[str, int] = {}
    for pairs in rounds:
        for src, dst in pairs:
            for _ in range(ports_per_pair):
                port = next_port.get(src, sport_base)
                next_port[src] = port + 1
                flows.append(Flow(len(flows), src, dst, port))
    return TrafficPlan(topology=topology.name, flows=flows, flows_per_nic=flows_per_nic, ports_per_pair=ports_per_pair,
                       epsilon=epsilon, target=target, link_ids=index.link_ids, expected_fwd=exp_fwd,
                       expected_rev=exp_rev, coverable_fwd=cov_fwd, coverable_rev=cov_rev, dport=dport, rounds=rounds)
