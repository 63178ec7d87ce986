"""The network effect: loop-consistent per-node clock offsets, flagged edges and islands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import workers.clocksolve.solver as solve_module
from testbed.clocksim.graphs import make_graph
from workers.clocksolve import GraphError, SolverConfig, parse_graph, solve

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = Path("/work/shared/clock-examples")
for candidate in (REPO.parent / "shared" / "clock-examples", REPO.parent.parent / "shared" / "clock-examples"):
    if candidate.is_dir():
        EXAMPLES = candidate


def node_errors(doc, truth):
    return np.array([doc["offsets_ns"][n] - v for n, v in truth["offsets_ns"].items()])


def test_the_loop_correction_reduces_the_error_of_noisy_pair_estimates():
    doc, truth = make_graph(seed=3, nodes=64, corrupt_frac=0.0, islands=0)
    g = parse_graph(doc)
    out = solve(g).to_document()
    true = truth["offsets_ns"]
    raw = np.array([e["offset_ns"] - (true[e["b"]] - true[e["a"]]) for e in doc["edges"]])
    corrected = np.array([(out["offsets_ns"][e["b"]] - out["offsets_ns"][e["a"]]) - (true[e["b"]] - true[e["a"]])
                          for e in doc["edges"]])
    assert np.sqrt(np.mean(corrected**2)) < 0.75 * np.sqrt(np.mean(raw**2))
    assert out["offsets_ns"][truth["reference"]] == 0.0
    assert not out["flagged"] and not out["disconnected"]


def test_a_corrupted_edge_is_flagged_by_its_residual_and_does_not_pull_its_neighbours():
    doc, truth = make_graph(seed=4, nodes=40, corrupt_frac=0.0, islands=0)
    victim = doc["edges"][5]
    victim["offset_ns"] += 60 * victim["sigma_ns"]
    g = parse_graph(doc)
    tukey = solve(g).to_document()
    plain = solve(g, SolverConfig(robust="none")).to_document()
    assert [(f["a"], f["b"]) for f in tukey["flagged"]] == [(victim["a"], victim["b"])]
    worst = next(r for r in tukey["residuals_ns"] if (r["a"], r["b"]) == (victim["a"], victim["b"]))
    assert abs(worst["residual_ns"]) > 30 * victim["sigma_ns"] and worst["flagged"]
    assert np.abs(node_errors(tukey, truth)).max() < np.abs(node_errors(plain, truth)).max()


def test_an_island_is_reported_as_disconnected_and_solved_only_against_itself():
    doc, truth = make_graph(seed=5, nodes=30, islands=1, island_size=(3, 3))
    out = solve(parse_graph(doc)).to_document()
    assert out["disconnected"] == truth["disconnected"] and len(out["disconnected"]) == 3
    assert not set(out["disconnected"]) & set(out["offsets_ns"])
    (island,) = out["islands"]
    assert island["nodes"] == truth["disconnected"] and island["offsets_ns"][island["reference"]] == 0.0


def test_tukey_beats_huber_on_graphs_with_gross_errors():
    tukey, huber, found, missed = [], [], 0, 0
    for seed in range(6):
        doc, truth = make_graph(seed=100 + seed, nodes=48, corrupt_frac=0.03)
        g = parse_graph(doc)
        t_out = solve(g).to_document()
        tukey += list(np.abs(node_errors(t_out, truth)))
        huber += list(np.abs(node_errors(solve(g, SolverConfig(robust="huber")).to_document(), truth)))
        flagged = {(f["a"], f["b"]) for f in t_out["flagged"]}
        bad = {(c["a"], c["b"]) for c in truth["corrupted"]}
        found += len(bad & flagged)
        missed += len(bad - flagged)
    assert found > 0 and missed == 0
    assert np.percentile(tukey, 99) < np.percentile(huber, 99)


def test_a_bridge_cannot_be_checked_and_is_never_flagged():
    doc = {"format": "lockstep.clockgraph/v1", "reference": "a", "nodes": ["a", "b", "c", "d"],
           "edges": [{"a": "a", "b": "b", "offset_ns": 10.0, "sigma_ns": 1.0},
                     {"a": "b", "b": "c", "offset_ns": 5.0, "sigma_ns": 1.0},
                     {"a": "a", "b": "c", "offset_ns": 15.5, "sigma_ns": 1.0},
                     {"a": "c", "b": "d", "offset_ns": 9999.0, "sigma_ns": 1.0}]}
    out = solve(parse_graph(doc)).to_document()
    assert out["offsets_ns"]["d"] == pytest.approx(out["offsets_ns"]["c"] + 9999.0)
    bridge = next(r for r in out["residuals_ns"] if r["b"] == "d")
    assert bridge["z"] is None and not bridge["flagged"]


def stepped_ring(stale_sigma_ns: float, stepped: str, honest_sigma_ns: float = 500.0, step_ns: float = 3e6):
    """Ten nodes in a ring with chords, true offsets 1 µs apart; ``stepped`` (n3 or n4) has just
    stepped by step_ns. Every estimate is fresh except the one between n3 and n4, measured before
    the step, which claims a precision of stale_sigma_ns. n3 has two more chords than n4, so an
    L1 fit that believes the stale pair moves n4 (dragging an unstepped node when n3 stepped) or
    holds n4 back (missing the step when n4 stepped)."""
    names = [f"n{i}" for i in range(10)]
    truth = {n: 1000.0 * i for i, n in enumerate(names)}
    truth[stepped] += step_ns
    pairs = [(i, (i + 1) % 10) for i in range(10)] + [(i, (i + 3) % 10) for i in range(0, 10, 2)] + [(3, 6), (3, 8)]
    noise = np.random.default_rng(11).normal(0.0, 0.3 * honest_sigma_ns, len(pairs))
    edges = []
    for (i, j), eps in zip(pairs, noise, strict=True):
        a, b = names[i], names[j]
        stale = {a, b} == {"n3", "n4"}
        sign = 1.0 if a == stepped else -1.0  # before the step, the stepped end still read its old time
        offset = truth[b] - truth[a] + sign * step_ns * stale + eps
        edges.append({"a": a, "b": b, "offset_ns": offset,
                      "sigma_ns": stale_sigma_ns if stale else honest_sigma_ns})
    return {"format": "lockstep.clockgraph/v1", "reference": "n0", "nodes": names, "edges": edges}, truth


@pytest.mark.parametrize("stepped", ["n3", "n4"])
@pytest.mark.parametrize("stale_sigma_ns", [500.0, 50.0, 5.0])
def test_one_over_precise_stale_estimate_neither_drags_a_neighbour_nor_hides_a_step(stale_sigma_ns, stepped):
    # The σ-weighted L1 start lets one pair that claims a tiny σ outvote a node's honest pairs; the
    # robust fit must still put every node where its honest pairs say and flag the stale pair.
    doc, truth = stepped_ring(stale_sigma_ns, stepped)
    out = solve(parse_graph(doc)).to_document()
    for node, offset in truth.items():
        assert out["offsets_ns"][node] == pytest.approx(offset, abs=2000), node
    assert [{f["a"], f["b"]} for f in out["flagged"]] == [{"n3", "n4"}]


def test_the_sketch_for_large_graphs_agrees_with_the_exact_uncertainties(monkeypatch):
    doc, _ = make_graph(seed=8, nodes=120, islands=0, corrupt_frac=0.02)
    g = parse_graph(doc)
    exact = solve(g).to_document()
    monkeypatch.setattr(solve_module, "DENSE_MAX_NODES", 10)
    sketch = solve(g, SolverConfig(sketch_k=256)).to_document()
    for node, offset in exact["offsets_ns"].items():
        assert sketch["offsets_ns"][node] == pytest.approx(offset, abs=1e-3)
    ratio = np.array([sketch["sigma_ns"][n] / exact["sigma_ns"][n] for n in exact["sigma_ns"] if exact["sigma_ns"][n]])
    assert 0.8 < np.median(ratio) < 1.2
    assert {(f["a"], f["b"]) for f in sketch["flagged"]} == {(f["a"], f["b"]) for f in exact["flagged"]}


def test_drifts_are_solved_when_every_edge_carries_one():
    doc, truth = make_graph(seed=9, nodes=32, islands=0, with_drift=True)
    out = solve(parse_graph(doc)).to_document()
    err = [abs(out["drift_ppm"][n] - v) for n, v in truth["drift_ppm"].items()]
    assert max(err) < 0.01


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(reference="nobody"), "reference"),
    (lambda d: d["nodes"].append(d["nodes"][0]), f"nodes[{50}]"),
    (lambda d: d["edges"][3].update(b="ghost"), "edges[3].b"),
    (lambda d: d["edges"][4].update(b=d["edges"][4]["a"]), "edges[4].b"),
    (lambda d: d["edges"][5].update(sigma_ns=0), "edges[5].sigma_ns"),
    (lambda d: d["edges"][6].update(offset_ns="12"), "edges[6].offset_ns"),
    (lambda d: d["edges"][7].pop("offset_ns"), "edges[7].offset_ns"),
])
def test_invalid_graphs_name_the_field(mutate, key):
    doc = json.loads((EXAMPLES / "graph-hw-48" / "graph.json").read_text())
    mutate(doc)
    with pytest.raises(GraphError) as info:
        parse_graph(doc)
    assert info.value.key == key


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "workers.clocksolve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_the_cli_solves_the_example_graph():
    result = run_cli(str(EXAMPLES / "graph-hw-48" / "graph.json"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    truth = json.loads((EXAMPLES / "graph-hw-48" / "truth.json").read_text())
    assert out["format"] == "lockstep.clocksolution/v1"
    assert set(out["offsets_ns"]) == set(truth["offsets_ns"])
    assert np.percentile(np.abs(node_errors(out, truth)), 99) < 30
    assert {(f["a"], f["b"]) for f in out["flagged"]} == {(c["a"], c["b"]) for c in truth["corrupted"]}
    assert out["disconnected"] == sorted(truth["disconnected"])
    assert all(set(r) >= {"a", "b", "residual_ns"} for r in out["residuals_ns"])
    assert set(out["sigma_ns"]) == set(out["offsets_ns"])


def test_the_cli_refuses_an_invalid_graph_with_a_named_error(tmp_path):
    doc = json.loads((EXAMPLES / "graph-hw-48" / "graph.json").read_text())
    doc["edges"][12]["sigma_ns"] = -3
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    result = run_cli(str(path))
    assert result.returncode == 2 and "edges[12].sigma_ns" in result.stderr and "-3" in result.stderr
    assert result.stdout == ""
    path.write_text("[1, 2")
    assert run_cli(str(path)).returncode == 1
