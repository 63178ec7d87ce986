"""Synthetic estimate graphs (``lockstep.clockgraph/v1``) with known truth.

Nodes sit under leaves (same-leaf pairs are one hop, low noise; cross-leaf pairs go through a
spine, noisier); each node probes a few peers on its own leaf and a few elsewhere, so the graph
has many short loops. An edge's estimate carries Gaussian noise of its stated σ (which is
itself only an estimate: the true noise is off by up to ±30 %), a constant path-asymmetry bias
(invisible to the pair, partly visible to the loops), and on a few edges a gross error
(20–200 σ, either sign). Islands are groups of nodes probing only each other.
"""

from __future__ import annotations

import numpy as np


def make_graph(seed: int, nodes: int = 48, klass: str = "hw", corrupt_frac: float = 0.015,
               islands: int = 1, island_size: tuple = (2, 4), peers: tuple = (4, 10),
               hosts_per_leaf: int = 8, with_drift: bool = False):
    rng = np.random.default_rng(seed)
    names = [f"node{i:04d}" for i in range(nodes)]
    ref = int(rng.integers(nodes))
    offsets = rng.uniform(-50e6, 50e6, nodes)
    drifts = rng.uniform(-50, 50, nodes)
    offsets[ref] = drifts[ref] = 0.0
    leaf = np.arange(nodes) // hosts_per_leaf
    scale = rng.uniform(5, 30) if klass == "hw" else rng.uniform(100, 1500)
    pairs: set[tuple[int, int]] = set()
    for i in range(nodes):
        want = int(rng.integers(peers[0], peers[1] + 1)) // 2 + 1
        same = [j for j in np.flatnonzero(leaf == leaf[i]) if j != i]
        other = list(np.flatnonzero(leaf != leaf[i]))
        for pool, count in ((same, (want + 1) // 2), (other, want // 2)):
            for j in rng.permutation(pool)[:count]:
                pairs.add((min(i, int(j)), max(i, int(j))))
    # Islands: the last nodes lose every edge to the rest and probe only among themselves.
    island_nodes: list[list[int]] = []
    free = [i for i in range(nodes - 1, -1, -1) if i != ref]
    for _ in range(islands):
        size = int(rng.integers(island_size[0], island_size[1] + 1))
        group, free = free[:size], free[size:]
        island_nodes.append(sorted(group))
    in_island = {n: k for k, g in enumerate(island_nodes) for n in g}
    pairs = {(a, b) for a, b in pairs if in_island.get(a) == in_island.get(b)}
    for group in island_nodes:  # a ring and a chord inside each island
        for k in range(len(group)):
            if len(group) > 1:
                a, b = group[k], group[(k + 1) % len(group)]
                if a != b:
                    pairs.add((min(a, b), max(a, b)))
    edges, truth_edges, corrupted = [], [], []
    for a, b in sorted(pairs):
        if rng.random() < 0.5:
            a, b = b, a
        hop = 1.0 if leaf[a] == leaf[b] else 2.0
        sigma = scale * hop * float(rng.lognormal(0, 0.35))
        true_noise = sigma * float(rng.uniform(0.7, 1.3))
        bias = float(rng.normal(0, 0.4 * sigma))
        err = float(rng.normal(0, true_noise)) + bias
        bad = rng.random() < corrupt_frac and a not in in_island and b not in in_island
        if bad:
            err += float(rng.choice([-1, 1]) * rng.uniform(20, 200) * sigma)
            corrupted.append({"a": names[a], "b": names[b], "error_ns": err})
        edge = {"a": names[a], "b": names[b], "offset_ns": round(offsets[b] - offsets[a] + err, 1),
                "sigma_ns": round(sigma, 2)}
        if with_drift:
            dsig = 0.002 * hop if klass == "hw" else 0.05 * hop
            edge["drift_ppm"] = round(drifts[b] - drifts[a] + float(rng.normal(0, dsig)), 6)
            edge["drift_sigma_ppm"] = dsig
        edges.append(edge)
        truth_edges.append({"a": names[a], "b": names[b], "error_ns": err, "corrupted": bool(bad)})
    order = rng.permutation(len(edges))
    doc = {"format": "lockstep.clockgraph/v1", "reference": names[ref], "nodes": names,
           "edges": [edges[k] for k in order]}
    disconnected = sorted(names[n] for g in island_nodes for n in g)
    truth = {"reference": names[ref],
             "offsets_ns": {names[i]: float(offsets[i]) for i in range(nodes) if i not in in_island},
             "drift_ppm": {names[i]: float(drifts[i]) for i in range(nodes) if i not in in_island},
             "disconnected": disconnected, "corrupted": corrupted, "edges": truth_edges, "seed": seed}
    return doc, truth
