"""Offline benchmark of the clock-sync cores on generated traces and graphs, and on the examples.

    python -m bench.clocksync offline                  # 20 traces per profile, 20 graphs
    python -m bench.clocksync offline --traces 50 --graphs 40 --json out.json

Traces (``testbed/clocksim/traces.py``, ten profiles: NIC or software timestamps; idle, loaded,
asymmetric, bursty, glitches): |offset error| and |drift error| of the estimator, of its
max-margin LP alone, and of the chrony-style regression (``bench/clocksync/chronyreg.py``), p50
and p99 per profile and pooled. Graphs (``testbed/clocksim/graphs.py``): node offset error of
plain weighted least squares, Huber IRLS and the default (L1 start, Tukey, flagged edges left
out), corrupted-edge recall and precision, islands reported right.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from agent.clocksync.fit import EstimatorConfig, estimate
from agent.clocksync.trace import parse_trace
from bench.clocksync.chronyreg import chrony_estimate
from testbed.clocksim.graphs import make_graph
from testbed.clocksim.traces import PROFILES, make_trace
from workers.clocksolve import SolverConfig, parse_graph, solve


def _examples() -> Path:
    repo = Path(__file__).resolve().parents[2]
    for candidate in (os.environ.get("LOCKSTEP_CLOCK_EXAMPLES", ""), repo.parent / "shared" / "clock-examples",
                      repo.parent.parent / "shared" / "clock-examples", "/work/shared/clock-examples"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return repo / "missing-clock-examples"


EXAMPLES = _examples()


def _pct(values, q) -> float:
    return float(np.percentile(np.abs(values), q)) if len(values) else float("nan")


def trace_row(doc: dict, truth: dict) -> dict:
    trace = parse_trace(doc)
    t0 = time.process_time()
    ours = estimate(trace)
    cpu = time.process_time() - t0
    margin = estimate(trace, EstimatorConfig(refine=False))
    chrony = chrony_estimate(trace)
    return {"ours": ours.offset_ns - truth["offset_ns"], "margin": margin.offset_ns - truth["offset_ns"],
            "chrony": chrony["offset_ns"] - truth["offset_ns"],
            "ours_drift": ours.drift_ppm - truth["drift_ppm"], "margin_drift": margin.drift_ppm - truth["drift_ppm"],
            "chrony_drift": chrony["drift_ppm"] - truth["drift_ppm"], "cpu_s": cpu, "z": (ours.offset_ns - truth["offset_ns"]) / ours.sigma_ns}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for key in ("ours", "margin", "chrony"):
        out[key] = {"offset_p50_ns": _pct([r[key] for r in rows], 50), "offset_p99_ns": _pct([r[key] for r in rows], 99),
                    "drift_p50_ppm": _pct([r[f"{key}_drift"] for r in rows], 50),
                    "drift_p99_ppm": _pct([r[f"{key}_drift"] for r in rows], 99)}
    out["ratio_p99_vs_chrony"] = out["ours"]["offset_p99_ns"] / out["chrony"]["offset_p99_ns"]
    out["cpu_s_mean"] = float(np.mean([r["cpu_s"] for r in rows]))
    out["abs_z_p50"] = _pct([r["z"] for r in rows], 50)
    return out


def run_traces(n: int, seed0: int = 1000) -> dict:
    per_profile, pooled = {}, []
    for profile in PROFILES:
        rows = [trace_row(*make_trace(profile, seed0 + s)) for s in range(n)]
        per_profile[profile] = summarize(rows)
        pooled += rows
    examples = {}
    for name in ("trace-hw-idle", "trace-sw-loaded"):
        path = EXAMPLES / name
        if path.is_dir():
            row = trace_row(json.loads((path / "trace.json").read_text()), json.loads((path / "truth.json").read_text()))
            examples[name] = {k: v for k, v in row.items()}
    return {"profiles": per_profile, "pooled": summarize(pooled), "examples": examples}


def graph_errors(doc: dict, truth: dict) -> dict:
    g = parse_graph(doc)
    out = {}
    for name, cfg in (("wls", SolverConfig(robust="none")), ("huber", SolverConfig(robust="huber")),
                      ("tukey", SolverConfig())):
        sol = solve(g, cfg).to_document()
        err = [sol["offsets_ns"][n] - v for n, v in truth["offsets_ns"].items()]
        out[name] = {"err": err, "flagged": {(f["a"], f["b"]) for f in sol["flagged"]},
                     "islands_ok": sol["disconnected"] == sorted(truth["disconnected"])}
    out["corrupted"] = {(c["a"], c["b"]) for c in truth["corrupted"]}
    return out


def run_graphs(n: int, seed0: int = 2000) -> dict:
    res: dict = {}
    for klass in ("hw", "sw"):
        errs = {"wls": [], "huber": [], "tukey": []}
        tp = fp = fn = islands_ok = 0
        cpu = 0.0
        for s in range(n):
            rng = np.random.default_rng(seed0 + s)
            doc, truth = make_graph(seed0 + s, nodes=int(rng.integers(24, 200)), klass=klass,
                                    corrupt_frac=float(rng.uniform(0.005, 0.04)), islands=int(rng.integers(0, 3)))
            t0 = time.process_time()
            r = graph_errors(doc, truth)
            cpu += time.process_time() - t0
            for k in errs:
                errs[k] += r[k]["err"]
            tp += len(r["tukey"]["flagged"] & r["corrupted"])
            fp += len(r["tukey"]["flagged"] - r["corrupted"])
            fn += len(r["corrupted"] - r["tukey"]["flagged"])
            islands_ok += r["tukey"]["islands_ok"]
        res[klass] = {k: {"p50_ns": _pct(v, 50), "p99_ns": _pct(v, 99)} for k, v in errs.items()}
        res[klass].update({"flag_recall": tp / max(tp + fn, 1), "flag_precision": tp / max(tp + fp, 1),
                           "islands_ok": f"{islands_ok}/{n}", "cpu_s_per_graph_all_three": cpu / n})
    path = EXAMPLES / "graph-hw-48"
    if path.is_dir():
        r = graph_errors(json.loads((path / "graph.json").read_text()), json.loads((path / "truth.json").read_text()))
        res["example graph-hw-48"] = {k: {"p50_ns": _pct(r[k]["err"], 50), "p99_ns": _pct(r[k]["err"], 99)}
                                      for k in ("wls", "huber", "tukey")}
        res["example graph-hw-48"]["flagged_right"] = r["tukey"]["flagged"] == r["corrupted"]
        res["example graph-hw-48"]["islands_ok"] = r["tukey"]["islands_ok"]
    return res


def print_tables(result: dict) -> None:
    t = result["traces"]
    print("\nper-pair estimator: |offset error| ns and |drift error| ppm (ours / LP alone / chrony-style)")
    print(f"{'profile':12s} {'ours p50':>9s} {'ours p99':>9s} {'LP p99':>9s} {'chr p50':>9s} {'chr p99':>9s} "
          f"{'p99 ratio':>9s} {'drift p99':>9s} {'chr drift':>9s}")
    for name, s in [*t["profiles"].items(), ("POOLED", t["pooled"])]:
        print(f"{name:12s} {s['ours']['offset_p50_ns']:9.1f} {s['ours']['offset_p99_ns']:9.1f} "
              f"{s['margin']['offset_p99_ns']:9.1f} {s['chrony']['offset_p50_ns']:9.1f} "
              f"{s['chrony']['offset_p99_ns']:9.1f} {s['ratio_p99_vs_chrony']:9.3f} "
              f"{s['ours']['drift_p99_ppm']:9.4f} {s['chrony']['drift_p99_ppm']:9.4f}")
    for name, r in t["examples"].items():
        print(f"{name:16s} ours {r['ours']:+9.1f} ns  LP {r['margin']:+9.1f}  chrony {r['chrony']:+9.1f}  "
              f"drift {r['ours_drift']:+.4f} ppm (chrony {r['chrony_drift']:+.4f})")
    print("\nnetwork effect: node |offset error| ns (plain WLS / Huber / Tukey+flags)")
    for name, r in result["graphs"].items():
        print(f"{name:20s} " + "  ".join(f"{k} p50 {r[k]['p50_ns']:.1f} p99 {r[k]['p99_ns']:.1f}"
                                         for k in ("wls", "huber", "tukey"))
              + "  " + "  ".join(f"{k} {r[k]}" for k in r if k not in ("wls", "huber", "tukey")))


def main(args) -> int:
    t0 = time.time()
    result = {"traces": run_traces(args.traces), "graphs": run_graphs(args.graphs)}
    result["wall_s"] = time.time() - t0
    print_tables(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=float))
    return 0
