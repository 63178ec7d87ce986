"""workers.clocksolve.network: the cluster's newest estimates, each at its own instant and drifting,
become one consistent correction per node; the probe plan has loops and stays connected."""

from __future__ import annotations

import random

import pytest

from workers.clocksolve.network import BOUND_SIGMAS, PairEstimate, probe_pairs, solve_cluster

T0 = 1_796_403_600_000_000_000


def truth(n: int, seed: int = 1):
    rng = random.Random(seed)
    names = [f"node{i:04d}" for i in range(n)]
    offsets = {h: (0.0 if i == 0 else rng.uniform(-50e6, 50e6)) for i, h in enumerate(names)}
    drifts = {h: (0.0 if i == 0 else rng.uniform(-50, 50)) for i, h in enumerate(names)}
    return names, offsets, drifts


def clock_of(h, offsets, drifts, real_ns: int) -> float:
    """Host h's clock minus the reference's at real time real_ns (the reference reads real time)."""
    return offsets[h] + drifts[h] * 1e-6 * (real_ns - T0)


def estimates(names, offsets, drifts, pairs, noise_ns: float, seed: int = 2, spread_s: float = 3.0):
    rng = random.Random(seed)
    out = []
    for a, b in pairs:
        real = T0 + int(rng.uniform(0, spread_s) * 1e9)  # each window ends at its own time
        t_ref = real + round(clock_of(a, offsets, drifts, real))  # on a's clock
        true = clock_of(b, offsets, drifts, real) - clock_of(a, offsets, drifts, real)
        out.append(PairEstimate(a, b, true + rng.gauss(0, noise_ns), drifts[b] - drifts[a] + rng.gauss(0, 0.01),
                                noise_ns, t_ref))
    return out


def test_estimates_at_different_instants_and_drifts_give_every_node_its_offset_within_its_bound():
    names, offsets, drifts = truth(12)
    pairs = probe_pairs(names, 4)
    sol = solve_cluster(names, names[0], estimates(names, offsets, drifts, pairs, noise_ns=50.0))
    assert sorted(sol.nodes) == names and sol.disconnected == [] and sol.flagged == []
    real = sol.at_ns  # the reference reads real time
    for h in names:
        corr = sol.nodes[h]
        err = corr.offset_ns - clock_of(h, offsets, drifts, real)
        assert abs(err) <= max(corr.bound_ns, 1.0), (h, err, corr)
        assert corr.bound_ns == pytest.approx(BOUND_SIGMAS * corr.sigma_ns)
        assert abs(corr.drift_ppm - drifts[h]) < 0.05
        assert corr.t_local_ns == real + round(corr.offset_ns)
    # 50 ppm over the 3-s spread is 150 µs: without bringing estimates to one instant this would fail
    assert sol.worst_bound_ns < 1000


def test_a_corrupted_pair_is_flagged_and_does_not_move_the_nodes():
    names, offsets, drifts = truth(10, seed=3)
    pairs = probe_pairs(names, 4)
    est = estimates(names, offsets, drifts, pairs, noise_ns=20.0)
    bad = est[5]
    est[5] = PairEstimate(bad.a, bad.b, bad.offset_ns + 40_000, bad.drift_ppm, bad.sigma_ns, bad.t_ref_ns)
    sol = solve_cluster(names, names[0], est)
    assert [(f["a"], f["b"]) for f in sol.flagged] == [(bad.a, bad.b)]
    for h in names:
        assert abs(sol.nodes[h].offset_ns - clock_of(h, offsets, drifts, sol.at_ns)) < 500


def test_an_island_is_reported_not_guessed_and_no_estimates_means_nobody_is_synced():
    names, offsets, drifts = truth(8, seed=4)
    main, island = names[:5], names[5:]
    pairs = probe_pairs(main, 3) + probe_pairs(island, 2)
    sol = solve_cluster(names, names[0], estimates(names, offsets, drifts, pairs, noise_ns=30.0))
    assert sorted(sol.nodes) == main and sol.disconnected == island
    empty = solve_cluster(names, names[0], [])
    assert empty.nodes == {} and empty.disconnected == names[1:] and empty.worst_bound_ns is None


def test_previous_offsets_only_refine_the_instant():
    names, offsets, drifts = truth(6, seed=5)
    est = estimates(names, offsets, drifts, probe_pairs(names, 3), noise_ns=10.0)
    first = solve_cluster(names, names[0], est)
    again = solve_cluster(names, names[0], est, {h: c.offset_ns for h, c in first.nodes.items()})
    for h in names:
        assert again.nodes[h].offset_ns == pytest.approx(first.nodes[h].offset_ns, abs=1.0)


@pytest.mark.parametrize("n,peers", [(2, 4), (3, 4), (6, 4), (20, 4), (50, 6)])
def test_probe_pairs_is_a_ring_with_chords_every_node_within_its_degree(n, peers):
    names = [f"h{i:03d}" for i in range(n)]
    pairs = probe_pairs(names, peers, seed=7)
    assert all(a < b for a, b in pairs) and len(set(pairs)) == len(pairs)
    degree = {h: 0 for h in names}
    for a, b in pairs:
        degree[a] += 1
        degree[b] += 1
    assert min(degree.values()) >= min(2, n - 1) and max(degree.values()) <= max(peers + 1, 2)
    ring = {tuple(sorted((names[i], names[(i + 1) % n]))) for i in range(n)} if n > 1 else set()
    assert ring <= set(pairs)
    assert probe_pairs(names, peers, seed=7) == pairs  # deterministic: a re-plan keeps the graph
    assert probe_pairs(["only"], peers) == []
