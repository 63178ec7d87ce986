"""The per-pair clock estimator: offset and drift from coded probes, robust to queueing and glitches."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agent.clocksync.fit import EstimateError, EstimatorConfig, coded_filter, estimate
from agent.clocksync.trace import TraceError, parse_trace
from bench.clocksync.chronyreg import chrony_estimate
from testbed.clocksim.traces import TraceParams, draw_params, make_trace

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO.parent.parent / "shared" / "clock-examples"
if not EXAMPLES.is_dir():
    EXAMPLES = Path("/work/shared/clock-examples")


def errors(profile, seeds, config=None):
    config = config or EstimatorConfig()
    off, drift = [], []
    for seed in seeds:
        doc, truth = make_trace(profile, seed)
        est = estimate(parse_trace(doc), config)
        off.append(est.offset_ns - truth["offset_ns"])
        drift.append(est.drift_ppm - truth["drift_ppm"])
    return np.abs(off), np.abs(drift)


def test_a_noise_free_trace_near_1_8e18_ns_is_recovered_to_the_nanosecond():
    params = TraceParams(theta0_ns=-12_345_678.0, drift_ppm=31.5, ts_sigma_ns=0.0, send_jitter_ns=0.0,
                         load=(0.0, 0.0), t_ref_frac=0.5)
    doc, truth = make_trace(params, seed=1)
    assert doc["probes"][0]["tx"] > 1.7e18
    est = estimate(parse_trace(doc))
    assert abs(est.offset_ns - truth["offset_ns"]) < 1.0
    assert abs(est.drift_ppm - truth["drift_ppm"]) < 0.001
    assert abs(est.min_owd_ns - params.owd_ns) < 2.0


@pytest.mark.parametrize("profile", ["hw-loaded", "hw-asym", "hw-bursty", "hw-glitch"])
def test_nic_timestamps_give_nanoseconds_under_queueing_asymmetry_bursts_and_glitches(profile):
    off, drift = errors(profile, range(3))
    assert off.max() < 15.0, off
    assert drift.max() < 0.02, drift


@pytest.mark.parametrize("profile", ["sw-loaded", "sw-asym", "sw-glitch"])
def test_software_timestamps_give_well_under_a_microsecond_and_beat_the_chrony_style_regression(profile):
    ours, chrony = [], []
    for seed in range(3):
        doc, truth = make_trace(profile, seed)
        trace = parse_trace(doc)
        ours.append(abs(estimate(trace).offset_ns - truth["offset_ns"]))
        chrony.append(abs(chrony_estimate(trace)["offset_ns"] - truth["offset_ns"]))
    assert max(ours) < 1500.0, ours
    assert np.mean(ours) < np.mean(chrony) / 3, (ours, chrony)


def test_glitches_that_would_break_a_hard_margin_are_dropped():
    # A glitch that hits both packets of a probe alike (a stamp taken from a stale clock read)
    # passes the coded filter; it lies far below the margin, where a hard margin would follow it.
    doc, truth = make_trace("hw-idle", seed=5)
    rng = np.random.default_rng(5)
    glitched = set(rng.choice(sorted({p["id"] for p in doc["probes"]}), 15, replace=False).tolist())
    for p in doc["probes"]:
        if p["id"] in glitched:
            p["rx" if p["dir"] == "ab" else "tx"] -= 40_000 + 1000 * (p["id"] % 50)
    trace = parse_trace(doc)
    hard = estimate(trace, EstimatorConfig(refine=False, violator_frac=0.0, glitch_k=1e12))
    est = estimate(trace)
    assert abs(hard.offset_ns - truth["offset_ns"]) > 1000  # a hard margin follows the glitches
    assert abs(est.offset_ns - truth["offset_ns"]) < 10
    assert est.details["glitches"] > 0


def test_t_ref_inside_the_window_is_where_the_offset_is_given():
    params = replace(draw_params("hw-loaded", np.random.default_rng(3)), t_ref_frac=0.25, drift_ppm=45.0)
    doc, truth = make_trace(params, seed=3)
    est = estimate(parse_trace(doc))
    assert abs(est.offset_ns - truth["offset_ns"]) < 10  # 45 ppm × 1.5 s = 67 µs if t_ref were ignored


def test_the_coded_filter_rejects_pairs_whose_receive_gap_was_disturbed():
    params = replace(draw_params("hw-idle", np.random.default_rng(9)), load=(0.0, 0.0), loss=0.0)
    doc, _ = make_trace(params, seed=9)
    disturbed = set()
    for p in doc["probes"]:
        if p["seq"] == 1 and p["id"] % 7 == 0:  # the second packet waited 3 µs longer
            p["rx"] += 3000
            disturbed.add(p["id"])
    trace = parse_trace(doc)
    keep, stats = coded_filter(trace)
    kept_ids = set(trace.probe_id[keep].tolist())
    assert disturbed and not (disturbed & kept_ids)
    clean = set(trace.probe_id.tolist()) - disturbed
    assert len(clean & kept_ids) > 0.95 * len(clean)
    assert stats["ab"]["threshold_ns"] < 3000


def test_a_direction_with_too_few_pairs_keeps_all_its_packets():
    doc, truth = make_trace("hw-idle", seed=2)
    doc["probes"] = [p for p in doc["probes"] if p["seq"] == 0]  # every partner lost
    est = estimate(parse_trace(doc))
    assert abs(est.offset_ns - truth["offset_ns"]) < 15


def test_sigma_is_a_fair_uncertainty():
    z = []
    for profile in ("hw-loaded", "sw-loaded"):
        for seed in range(4):
            doc, truth = make_trace(profile, seed + 40)
            est = estimate(parse_trace(doc))
            z.append((est.offset_ns - truth["offset_ns"]) / est.sigma_ns)
    assert 0.2 < np.median(np.abs(z)) < 3.0, z


def test_one_direction_alone_cannot_be_estimated():
    doc, _ = make_trace("hw-idle", seed=1)
    doc["probes"] = [p for p in doc["probes"] if p["dir"] == "ab"]
    with pytest.raises(EstimateError, match="both directions"):
        estimate(parse_trace(doc))


@pytest.mark.parametrize(("mutate", "key", "value"), [
    (lambda d: d.update(format="lockstep.clocktrace/v2"), "format", "lockstep.clocktrace/v2"),
    (lambda d: d.pop("t_ref_ns"), "t_ref_ns", None),
    (lambda d: d["probes"][3].update(tx="1795854338973479298"), "probes[3].tx", "1795854338973479298"),
    (lambda d: d["probes"][2].update(dir="ca"), "probes[2].dir", "ca"),
    (lambda d: d["probes"][4].update(seq=2), "probes[4].seq", 2),
    (lambda d: d["probes"][1].update(seq=0), "probes[1].seq", 0),
    (lambda d: d["probes"][5].update(rx=True), "probes[5].rx", True),
    (lambda d: d["probes"][6].update(rx=d["probes"][6]["rx"] // 1000), "probes[6]", None),
])
def test_invalid_traces_name_the_field_the_probe_and_the_value(mutate, key, value):
    doc, _ = make_trace("hw-idle", seed=1)
    mutate(doc)
    with pytest.raises(TraceError) as info:
        parse_trace(doc)
    assert info.value.key == key
    if value is not None:
        assert info.value.value == value
        assert repr(value)[:20] in str(info.value)


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "agent.clocksync.estimate", *args], cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("example", "offset_bound", "drift_bound"), [
    ("trace-hw-idle", 10.0, 0.02), ("trace-sw-loaded", 1000.0, 0.5)])
def test_the_cli_estimates_the_examples_within_bounds_of_their_truth(example, offset_bound, drift_bound):
    result = run_cli(str(EXAMPLES / example / "trace.json"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    truth = json.loads((EXAMPLES / example / "truth.json").read_text())
    assert out["format"] == "lockstep.clockestimate/v1"
    assert abs(out["offset_ns"] - truth["offset_ns"]) < offset_bound
    assert abs(out["drift_ppm"] - truth["drift_ppm"]) < drift_bound
    assert out["sigma_ns"] > 0 and out["probes_used"] > 100 and out["min_owd_ns"] > 0


def test_the_cli_refuses_bad_input_with_a_named_error(tmp_path):
    doc, _ = make_trace("hw-idle", seed=1)
    doc["probes"][7]["rx"] = -5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    result = run_cli(str(bad))
    assert result.returncode == 2
    assert "probes[7].rx" in result.stderr and "-5" in result.stderr
    assert result.stdout == ""
    assert run_cli("-", stdin="{not json").returncode == 1
    assert run_cli(str(tmp_path / "missing.json")).returncode == 1
    doc["probes"] = [p for p in make_trace("hw-idle", seed=1)[0]["probes"] if p["dir"] == "ba"]
    one_way = tmp_path / "oneway.json"
    one_way.write_text(json.dumps(doc))
    result = run_cli(str(one_way))
    assert result.returncode == 3 and "both directions" in result.stderr
