"""ECMP paths (workers/fabric/paths.py): hand-built fabrics with known path sets, the public
examples, generated two- and three-tier fabrics, and the incidence helpers checked against
brute-force enumeration."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from testbed.simulate.topology import PRESETS, generate_topology
from workers.fabric.paths import PathIndex, TooManyPaths
from workers.fabric.topology import parse_topology

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"
EXAMPLES = sorted(p for p in SCENARIOS.iterdir() if (p / "topology.json").exists())


def fabric(switches, nics, links, name="hand"):
    """A topology from compact lists: switches [(name, tier)], nics [name], links [(id, a, b)]."""
    hosts = sorted({n.split("/")[0] for n in nics})
    return parse_topology({
        "format": "lockstep.topology/v1", "name": name,
        "hosts": [{"name": h} for h in hosts],
        "switches": [{"name": s, "tier": t} for s, t in switches],
        "nics": [{"name": n, "host": n.split("/")[0]} for n in nics],
        "links": [{"id": i, "a": a, "b": b} for i, a, b in links],
    })


@pytest.fixture(scope="module")
def example_index():
    return PathIndex(parse_topology(json.loads((EXAMPLES[0] / "topology.json").read_text())))


@pytest.fixture(scope="module")
def three_tier():
    return PathIndex(parse_topology(generate_topology(PRESETS["gpu2048-3tier"][0])))


# ---- hand-built fabrics ---------------------------------------------------------------------


def test_parallel_links_are_distinct_paths():
    t = fabric([("A", "leaf"), ("B", "leaf"), ("S", "spine")], ["h1/n", "h2/n"], [
        ("h1a", "h1/n", "A"), ("h2b", "h2/n", "B"),
        ("AS0", "A", "S"), ("AS1", "A", "S"), ("AS2", "A", "S"), ("BS0", "B", "S"), ("BS1", "S", "B"),
    ])
    idx = PathIndex(t)
    expected = {("h1a", a, b, "h2b") for a in ("AS0", "AS1", "AS2") for b in ("BS0", "BS1")}
    assert set(idx.paths("h1/n", "h2/n")) == expected
    assert len(idx.paths("h1/n", "h2/n")) == 6
    assert idx.count_paths("h1/n", "h2/n") == 6
    assert idx.hop_count("h1/n", "h2/n") == 4
    fr = idx.link_fractions("h1/n", "h2/n")
    assert fr == pytest.approx({"h1a": 1, "h2b": 1, "AS0": 1 / 3, "AS1": 1 / 3, "AS2": 1 / 3,
                                "BS0": 0.5, "BS1": 0.5})
    # reverse direction: same links, reversed order
    assert set(idx.paths("h2/n", "h1/n")) == {tuple(reversed(p)) for p in expected}
    with pytest.raises(TooManyPaths):
        idx.paths("h1/n", "h2/n", limit=5)


def test_two_tier_same_leaf_and_cross_leaf():
    t = fabric([("L0", "leaf"), ("L1", "leaf"), ("S0", "spine"), ("S1", "spine")],
               ["a/n", "b/n", "c/n"], [
                   ("a", "a/n", "L0"), ("b", "b/n", "L0"), ("c", "c/n", "L1"),
                   ("L0S0", "L0", "S0"), ("L0S1", "L0", "S1"), ("L1S0", "L1", "S0"), ("L1S1", "L1", "S1"),
               ])
    idx = PathIndex(t)
    assert idx.paths("a/n", "b/n") == [("a", "b")]
    assert idx.hop_count("a/n", "b/n") == 2
    assert set(idx.paths("a/n", "c/n")) == {("a", "L0S0", "L1S0", "c"), ("a", "L0S1", "L1S1", "c")}
    assert idx.switch_fractions("a/n", "c/n") == pytest.approx({"L0": 1, "L1": 1, "S0": 0.5, "S1": 0.5})
    assert idx.path_switches("a/n", ("a", "L0S1", "L1S1", "c")) == ("L0", "S1", "L1")
    assert idx.connected()


def test_three_tier_cross_pod_goes_through_the_cores_of_one_plane():
    sw = [("l0", "leaf"), ("l1", "leaf"), ("s00", "spine"), ("s01", "spine"), ("s10", "spine"),
          ("s11", "spine"), ("c0", "core"), ("c1", "core")]
    links = [("x", "x/n", "l0"), ("y", "y/n", "l1"),
             ("l0s00", "l0", "s00"), ("l0s01", "l0", "s01"), ("l1s10", "l1", "s10"), ("l1s11", "l1", "s11"),
             ("s00c0", "s00", "c0"), ("s10c0", "s10", "c0"), ("s01c1", "s01", "c1"), ("s11c1", "s11", "c1")]
    idx = PathIndex(fabric(sw, ["x/n", "y/n"], links))
    assert set(idx.paths("x/n", "y/n")) == {
        ("x", "l0s00", "s00c0", "s10c0", "l1s10", "y"),
        ("x", "l0s01", "s01c1", "s11c1", "l1s11", "y"),
    }
    assert idx.hop_count("x/n", "y/n") == 6
    assert idx.walk("x/n", ("x", "l0s00", "s00c0", "s10c0", "l1s10", "y")) == (
        "x/n", "l0", "s00", "c0", "s10", "l1", "y/n")


def test_only_shortest_paths_count():
    # a direct leaf-leaf cable makes the two-spine detours longer than the shortest path
    t = fabric([("L0", "leaf"), ("L1", "leaf"), ("S", "spine")], ["a/n", "b/n"], [
        ("a", "a/n", "L0"), ("b", "b/n", "L1"), ("L0S", "L0", "S"), ("L1S", "L1", "S"), ("L0L1", "L0", "L1"),
    ])
    idx = PathIndex(t)
    assert idx.paths("a/n", "b/n") == [("a", "L0L1", "b")]
    assert idx.is_shortest_path("a/n", "b/n", ("a", "L0L1", "b"))
    assert not idx.is_shortest_path("a/n", "b/n", ("a", "L0S", "L1S", "b"))


def test_paths_never_transit_a_nic_and_direct_nic_links_work():
    # m/n has links to both leaves: it must not become a shortcut between them
    t = fabric([("L0", "leaf"), ("L1", "leaf"), ("S", "spine")], ["a/n", "b/n", "m/n", "p/n", "q/n"], [
        ("a", "a/n", "L0"), ("b", "b/n", "L1"), ("m0", "m/n", "L0"), ("m1", "m/n", "L1"),
        ("L0S", "L0", "S"), ("L1S", "L1", "S"), ("pq", "p/n", "q/n"), ("p", "p/n", "L0"),
    ])
    idx = PathIndex(t)
    assert idx.paths("a/n", "b/n") == [("a", "L0S", "L1S", "b")]
    # a multi-homed NIC uses whichever attachment is shortest
    assert idx.paths("a/n", "m/n") == [("a", "m0")]
    assert idx.paths("p/n", "q/n") == [("pq",)]
    assert idx.hop_count("p/n", "q/n") == 1
    inc = idx.incidence([("a/n", "b/n"), ("a/n", "m/n"), ("p/n", "q/n")])
    assert list(inc.hops) == [4, 2, 1]
    with pytest.raises(ValueError, match="continues through NIC"):
        idx.walk("a/n", ("a", "m0", "m1", "b"))


def test_unreachable_pairs():
    t = fabric([("L0", "leaf"), ("L1", "leaf")], ["a/n", "b/n"], [("a", "a/n", "L0"), ("b", "b/n", "L1")])
    idx = PathIndex(t)
    assert idx.hop_count("a/n", "b/n") is None
    assert idx.count_paths("a/n", "b/n") == 0
    assert idx.paths("a/n", "b/n") == []
    assert not idx.connected()
    inc = idx.incidence([("a/n", "b/n")])
    assert not inc.reachable[0]
    assert inc.link_fractions(["a"])[0, 0] == 0


def test_bad_inputs_are_named():
    idx = PathIndex(fabric([("L", "leaf")], ["a/n", "b/n"], [("a", "a/n", "L"), ("b", "b/n", "L")]))
    with pytest.raises(KeyError, match="nope"):
        idx.hop_count("a/n", "nope")
    with pytest.raises(ValueError, match="same NIC"):
        idx.count_paths("a/n", "a/n")
    with pytest.raises(ValueError, match=r"path\[1\]: 'zz' is not a link"):
        idx.walk("a/n", ("a", "zz"))
    with pytest.raises(ValueError, match=r"does not touch"):
        idx.walk("a/n", ("b",))
    with pytest.raises(ValueError, match=r"paths\[0\]"):
        idx.incidence([("a/n", "b/n")], paths=[("a",)])


# ---- the public examples ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", EXAMPLES, ids=lambda p: p.name)
def test_every_known_path_in_the_examples_is_one_of_our_ecmp_paths(scenario):
    topo = parse_topology(json.loads((scenario / "topology.json").read_text()))
    idx = PathIndex(topo)
    obs = json.loads((scenario / "observations.json").read_text())
    with_path = [p for p in obs["probes"] if "path" in p]
    for p in with_path:
        assert tuple(p["path"]) in set(idx.iter_paths(p["src"], p["dst"])), p
    # the incidence of the known paths is exactly their links
    inc = idx.incidence([(p["src"], p["dst"]) for p in with_path], [p["path"] for p in with_path])
    pair, link, frac, _ = inc.coo()
    assert Counter(pair.tolist()) == Counter(i for i, p in enumerate(with_path) for _ in p["path"])
    assert np.all(frac == 1.0)
    assert inc.sample_paths(np.random.default_rng(0)) == [tuple(p["path"]) for p in with_path]


def test_example_fabric_shape(example_index):
    idx = example_index
    assert idx.connected()
    assert idx.hop_count("node0000/nic0", "node0001/nic0") == 2  # same leaf
    assert idx.count_paths("node0000/nic0", "node0009/nic0") == 4  # other SU: one path per spine
    assert idx.count_paths("node0000/nic0", "node0000/nic1") == 4  # cross-rail through the spines
    assert {p[1].split("~")[1] for p in idx.paths("node0000/nic0", "node0000/nic1")} == {
        f"spine-p0-0{i}#0" for i in range(4)}


# ---- incidence against brute force -----------------------------------------------------------


def _random_pairs(idx, n, seed):
    rng = np.random.default_rng(seed)
    names = idx.nic_names
    out = set()
    while len(out) < n:
        a, b = rng.integers(len(names), size=2)
        if a != b:
            out.add((names[a], names[b]))
    return sorted(out)


@pytest.mark.parametrize("which", ["example", "three_tier"])
def test_incidence_matches_enumerated_paths(which, example_index, three_tier):
    idx = example_index if which == "example" else three_tier
    pairs = _random_pairs(idx, 60, seed=3)
    rng = np.random.default_rng(4)
    fwd_f = rng.uniform(0.5, 1.0, len(idx.link_ids))
    rev_f = rng.uniform(0.5, 1.0, len(idx.link_ids))
    sw_f = rng.uniform(0.5, 1.0, len(idx.switch_names))
    # a third of the pairs with a known (any ECMP) path
    known = [idx.paths(s, d)[-1] if i % 3 == 0 else None for i, (s, d) in enumerate(pairs)]
    inc = idx.incidence(pairs, known)
    expected_frac: dict[tuple[int, str, bool], float] = {}
    expected_sw = np.zeros((len(pairs), len(idx.switch_names)))
    expected_prod = np.zeros(len(pairs))
    for i, (s, d) in enumerate(pairs):
        paths = [known[i]] if known[i] else idx.paths(s, d)
        assert inc.npaths[i] == len(paths)
        assert inc.hops[i] == len(paths[0])
        for path in paths:
            nodes = idx.walk(s, path)
            prod = 1.0
            for j, lid in enumerate(path):
                k = idx.link_index[lid]
                forward = idx.link_a[k] == nodes[j]
                key = (i, lid, forward)
                expected_frac[key] = expected_frac.get(key, 0.0) + 1.0 / len(paths)
                prod *= fwd_f[k] if forward else rev_f[k]
            for node in nodes[1:-1]:
                expected_sw[i, idx.switch_index[node]] += 1.0 / len(paths)
                prod *= sw_f[idx.switch_index[node]]
            expected_prod[i] += prod / len(paths)
    pair, link, frac, fwd = inc.coo()
    got = {(int(p), idx.link_ids[k], bool(f)): v for p, k, v, f in zip(pair, link, frac, fwd, strict=True)}
    assert got.keys() == expected_frac.keys()
    for key, v in expected_frac.items():
        assert got[key] == pytest.approx(v)
    # dense per-link fractions agree with the explicit rows
    some = sorted({lid for _, lid, _ in expected_frac})[:40]
    f_dir, r_dir = inc.link_fractions(some, directed=True)
    for j, lid in enumerate(some):
        for i in range(len(pairs)):
            assert f_dir[i, j] == pytest.approx(expected_frac.get((i, lid, True), 0.0))
            assert r_dir[i, j] == pytest.approx(expected_frac.get((i, lid, False), 0.0))
    assert inc.switch_fractions(idx.switch_names) == pytest.approx(expected_sw)
    assert inc.mean_path_product(fwd_f, rev_f, sw_f) == pytest.approx(expected_prod)
    # loads are the weighted column sums
    w = rng.uniform(1, 2, len(pairs))
    lf, lr, sl = inc.loads(w)
    exp_lf = np.zeros(len(idx.link_ids))
    exp_lr = np.zeros(len(idx.link_ids))
    for (i, lid, forward), v in expected_frac.items():
        (exp_lf if forward else exp_lr)[idx.link_index[lid]] += w[i] * v
    assert lf == pytest.approx(exp_lf)
    assert lr == pytest.approx(exp_lr)
    assert sl == pytest.approx(w @ expected_sw)
    two = np.stack((w, 2 * w), axis=1)
    lf2, _, sl2 = inc.loads(two)
    assert lf2[:, 1] == pytest.approx(2 * exp_lf) and sl2[:, 0] == pytest.approx(w @ expected_sw)
    # host and NIC ends
    hosts = inc.host_counts([s.split("/")[0] for s, _ in pairs[:5]])
    assert np.all(np.diag(hosts) >= 1)


def test_sampled_paths_are_ecmp_paths_drawn_evenly(three_tier):
    idx = three_tier
    src, dst = "node0000/nic0", "node0255/nic3"  # cross-pod, cross-rail
    paths = set(idx.paths(src, dst))
    n_paths = len(paths)
    assert n_paths == idx.count_paths(src, dst) == 16 * 2 * 4 * 2 * 2 * 2
    inc = idx.incidence([(src, dst)] * 20000)
    drawn = inc.sample_paths(np.random.default_rng(11))
    assert set(drawn) <= paths
    # even spreading: every first-hop uplink (32 of them) gets ~1/32 of the draws
    first = Counter(p[1] for p in drawn)
    assert len(first) == 32
    expected = 20000 / 32
    assert max(abs(c - expected) for c in first.values()) < 5 * np.sqrt(expected)


def test_nine_thousand_gpu_fabric_counts_without_enumerating():
    params = PRESETS["gpu9216"][0]
    idx = PathIndex(parse_topology(generate_topology(params)))
    assert len(idx.nic_names) == 9216
    assert idx.connected()
    up = params.spines * params.links_per_leaf_spine  # leaf -> spines of its pod
    across = params.cores_per_plane * params.links_per_spine_core  # spine -> cores of its plane
    down = params.links_per_spine_core * params.links_per_leaf_spine  # core -> spine -> leaf
    assert idx.count_paths("node0000/nic0", "node1151/nic7") == up * across * down == 2304
    assert idx.hop_count("node0000/nic0", "node1151/nic7") == 6
    assert idx.count_paths("node0000/nic0", "node0032/nic0") == up * params.links_per_leaf_spine  # same pod
    assert idx.hop_count("node0000/nic0", "node0032/nic0") == 4
    # hop counts of a spread of pairs: 2 (same leaf), 4 (same pod), 6 (other pod), nothing else
    pairs = [(idx.nic_names[i], idx.nic_names[j]) for i, j in itertools.product(range(0, 9216, 997), repeat=2)
             if i != j]
    assert set(idx.incidence(pairs).hops.tolist()) <= {2, 4, 6}


def test_known_paths_that_are_not_walks_are_named(example_index):
    pairs = [("node0000/nic0", "node0001/nic0"), ("node0000/nic0", "node0009/nic0")]
    good = ("node0000/nic0~leaf-su00-r0", "node0001/nic0~leaf-su00-r0")
    with pytest.raises(ValueError, match=r"paths\[1\]: path\[1\]: 'nope' is not a link"):
        example_index.incidence(pairs, [good, ("node0000/nic0~leaf-su00-r0", "nope")])
    with pytest.raises(ValueError, match=r"paths\[1\]: path\[1\]: link .* does not touch"):
        example_index.incidence(pairs, [good, ("node0000/nic0~leaf-su00-r0", "leaf-su01-r0~spine-p0-00#0")])
    with pytest.raises(ValueError, match=r"paths\[1\]: ends at 'node0001/nic0'"):
        example_index.incidence(pairs, [None, good])
    # a known path need not be shortest: it is taken as given
    detour = ("node0000/nic0~leaf-su00-r0", "leaf-su00-r0~spine-p0-00#0", "leaf-su01-r0~spine-p0-00#0",
              "leaf-su01-r0~spine-p0-01#0", "leaf-su00-r0~spine-p0-01#0", "node0001/nic0~leaf-su00-r0")
    inc = example_index.incidence(pairs[:1], [detour])
    assert inc.hops[0] == 6
    assert inc.switch_fractions(["leaf-su00-r0", "spine-p0-00"]).tolist() == [[2.0, 1.0]]


def test_mean_path_product_when_every_pair_has_a_known_path(example_index):
    idx = example_index
    nn = idx.nic_names
    pairs = [(nn[0], nn[20]), (nn[1], nn[40])]
    paths = [idx.paths(*p)[0] for p in pairs]
    inc = idx.incidence(pairs, paths)
    assert inc.mean_path_product(np.full(len(idx.link_ids), 0.9)) == pytest.approx([0.9 ** 4, 0.9 ** 4])


def test_fraction_entries_agree_with_link_and_switch_fractions(example_index, three_tier):
    for idx in (example_index, three_tier):
        rng = np.random.default_rng(1)
        nn = idx.nic_names
        pairs = [(nn[a], nn[b]) for a, b in rng.integers(len(nn), size=(300, 2)) if a != b]
        known = [idx.paths(*p)[0] if i % 3 == 0 else None for i, p in enumerate(pairs)]
        inc = idx.incidence(pairs, known)
        links = rng.choice(len(idx.link_ids), 40, replace=False)
        forward = rng.random(40) < 0.5
        switches = rng.choice(len(idx.switch_names), 10, replace=False)
        r, c, v = inc.fraction_entries(links, forward, switches)
        got = np.zeros((len(pairs), 50))
        np.add.at(got, (r, c), v)
        fw, rv = inc.link_fractions([idx.link_ids[k] for k in links], directed=True)
        assert got[:, :40] == pytest.approx(np.where(forward[None, :], fw, rv))
        assert got[:, 40:] == pytest.approx(inc.switch_fractions([idx.switch_names[s] for s in switches]))


def test_loads_of_several_weight_columns_match_one_at_a_time(three_tier):
    idx = three_tier
    rng = np.random.default_rng(2)
    nn = idx.nic_names
    pairs = [(nn[a], nn[b]) for a, b in rng.integers(len(nn), size=(500, 2)) if a != b]
    inc = idx.incidence(pairs)
    w = rng.random((len(pairs), 3))
    fwd, rev, sw = inc.loads(w)
    for c in range(3):
        f1, r1, s1 = inc.loads(w[:, c])
        assert fwd[:, c] == pytest.approx(f1) and rev[:, c] == pytest.approx(r1) and sw[:, c] == pytest.approx(s1)
