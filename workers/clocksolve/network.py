"""From a cluster's latest pair estimates to each node's clock correction (pure: no I/O, no clock).

The console keeps the newest estimate of every probed pair; each was taken at its own instant
(``t_ref_ns`` on the estimating node's clock) and drifts since. :func:`solve_cluster` brings
them to one instant — the reference clock's reading ``R`` — with their drifts, solves the graph
(:func:`workers.clocksolve.solve`, offsets and drifts), and repeats once with the offsets it
found (a node's ``t_ref`` is on its own clock, ±50 ms from the reference: the second pass puts
each estimate at the right instant to well under a ns). A node's result is its clock minus the
reference's at ``R``; the agent adopts it as ``offset + drift·(t − t_local)`` with ``t_local =
R + offset``, the instant ``R`` on its own clock.

:func:`probe_pairs` plans who probes whom: a ring (every node in one loop) plus chords to a few
more peers, so the graph has many short loops and stays connected when one node is gone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from workers.clocksolve.graph import GRAPH_FORMAT, parse_graph
from workers.clocksolve.solver import solve

BOUND_SIGMAS = 3.0  # the stated bound of a node's offset: this many of its standard uncertainties
DRIFT_SIGMA_PER_NS = 1e-3  # ppm of drift uncertainty per ns of offset uncertainty of a 2-s window


@dataclass(frozen=True)
class PairEstimate:
    a: str  # the estimating node
    b: str
    offset_ns: float  # b − a at t_ref_ns
    drift_ppm: float
    sigma_ns: float
    t_ref_ns: int  # on a's clock


@dataclass(frozen=True)
class NodeCorrection:
    offset_ns: float  # node clock − reference clock at the solve's instant
    drift_ppm: float
    sigma_ns: float
    bound_ns: float
    t_local_ns: int  # the solve's instant on the node's clock


@dataclass(frozen=True)
class ClusterSolution:
    reference: str
    at_ns: int  # the solve's instant on the reference clock
    nodes: dict[str, NodeCorrection]  # connected to the reference
    disconnected: list[str]  # cut off from the reference (islands): reported, never guessed
    flagged: list[dict]  # edges whose residual says they are wrong: {a, b, residual_ns, z}
    residuals: list[dict]
    noise_scale: float

    @property
    def worst_bound_ns(self) -> float | None:
        return max((c.bound_ns for c in self.nodes.values()), default=None)


def solve_cluster(nodes: list[str], reference: str, estimates: list[PairEstimate],
                  previous: dict[str, float] | None = None) -> ClusterSolution:
    """Corrections of every node connected to ``reference`` (``previous``: last offsets, a better start)."""
    x_prev = dict(previous or {})
    known = set(nodes)
    usable = [e for e in estimates if e.a in known and e.b in known and e.a != e.b]
    if not usable:
        at = 0
        return ClusterSolution(reference, at, {}, sorted(n for n in nodes if n != reference), [], [], 1.0)
    doc = None
    r_ref = 0
    for _ in range(2):
        r_ref = max(e.t_ref_ns - round(x_prev.get(e.a, 0.0)) for e in usable)
        edges = [{"a": e.a, "b": e.b, "sigma_ns": e.sigma_ns, "drift_ppm": e.drift_ppm,
                  "drift_sigma_ppm": e.sigma_ns * DRIFT_SIGMA_PER_NS,
                  "offset_ns": e.offset_ns + e.drift_ppm * 1e-6 * (r_ref + x_prev.get(e.a, 0.0) - e.t_ref_ns)}
                 for e in usable]
        graph = {"format": GRAPH_FORMAT, "reference": reference, "nodes": list(nodes), "edges": edges}
        doc = solve(parse_graph(graph)).to_document()
        x_prev = dict(doc["offsets_ns"])
    drifts = doc.get("drift_ppm", {})
    out = {}
    for name, offset in doc["offsets_ns"].items():
        sigma = float(doc["sigma_ns"][name])
        out[name] = NodeCorrection(float(offset), float(drifts.get(name, 0.0)), sigma, BOUND_SIGMAS * sigma,
                                   int(r_ref + round(offset)))
    return ClusterSolution(reference, int(r_ref), out, list(doc["disconnected"]), list(doc["flagged"]),
                           list(doc["residuals_ns"]), float(doc["noise_scale"]))


def probe_pairs(nodes: list[str], peers: int = 4, seed: int = 0) -> list[tuple[str, str]]:
    """Undirected pairs (a < b) to probe: a ring over ``nodes`` plus chords up to ``peers`` per node."""
    names = sorted(set(nodes))
    n = len(names)
    if n < 2:
        return []
    pairs = {tuple(sorted((names[i], names[(i + 1) % n]))) for i in range(n)}
    want = max(2, min(peers, n - 1))
    degree = {name: 0 for name in names}
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
    rng = random.Random(seed)
    for name in names:
        others = [o for o in names if o != name]
        rng.shuffle(others)
        for other in others:
            if degree[name] >= want:
                break
            pair = tuple(sorted((name, other)))
            if pair in pairs or degree[other] >= want + 1:
                continue
            pairs.add(pair)
            degree[name] += 1
            degree[other] += 1
    return sorted(pairs)
