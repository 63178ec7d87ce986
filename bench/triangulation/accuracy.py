"""Accuracy of the triangulation and two baselines on two scenario generators.

    python -m bench.triangulation accuracy                    # both suites, default sizes
    python -m bench.triangulation accuracy --sim 6 --gen2 300 --out var/bench-tri

Suite `sim`: windows from testbed.simulate (the generator of the public examples) on its
256-GPU example fabric, the 1,024-GPU preset and a small three-tier fabric: every fault kind
alone, healthy windows, and several faults at once (`SIM_FAULT_SETS`), `--sim` seeds each.
Suite `gen2`: `--gen2` windows from bench/triangulation/gen2.py (other topologies, names,
magnitudes, noise, partial paths; see its docstring), one random draw per seed.

Scoring (formats/fabric.md): a culprit matching a true fault by kind and name is a true
positive, every other culprit a false positive, every unmatched fault a false negative;
precision, recall and F1 summed over the scenarios of a set. Per fault kind: recall over the
faults of that kind (all scenarios), precision and F1 over the scenarios whose faults are of
that kind alone. Also: network_ok right, healthy windows with any culprit, and the precision of
the triangulation's culprits by confidence band (calibration).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.triangulation import gen2
from bench.triangulation.baselines import greedy_set_cover, vote_007
from testbed.simulate.topology import PRESETS, TopoParams, generate_topology
from testbed.simulate.window import WindowConfig, simulate
from workers.fabric.observations import parse_observations
from workers.fabric.topology import parse_topology
from workers.triangulation import FabricModel, Verdict, triangulate

SIM_TOPOLOGIES = {
    "example-256": PRESETS["example"][0],
    "gpu1024": PRESETS["gpu1024"][0],
    "3tier-512": TopoParams(hosts=64, rails=8, hosts_per_leaf=8, spines=4, links_per_leaf_spine=2,
                            su_per_pod=2, cores_per_plane=2, links_per_spine_core=1),
}
SIM_FAULT_SETS = (
    "none", "link_loss:1", "link_down:1", "link_congestion:1", "switch_loss:1", "nic_loss:1",
    "nic_down:1", "host_loss:1", "host_stall:1", "host_delay:1",
    "link_loss:2", "link_loss:1,host_loss:1", "switch_loss:1,nic_loss:1",
    "link_loss:1,link_congestion:1,nic_down:1", "link_down:1,host_delay:1,switch_loss:1",
)
METHODS: dict[str, Callable[[FabricModel, Any], Verdict]] = {
    "triangulation": lambda model, window: triangulate(model, window),
    "007 voting": vote_007,
    "greedy set cover": greedy_set_cover,
}


@dataclass
class Case:
    suite: str
    name: str
    topology: dict[str, Any]
    observations: dict[str, Any]
    truth: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)


def sim_cases(seeds: int, first_seed: int = 7000) -> Iterator[Case]:
    seed = first_seed
    for label, params in SIM_TOPOLOGIES.items():
        doc = generate_topology(params)
        topo = parse_topology(doc)
        for spec in SIM_FAULT_SETS:
            for _ in range(seeds):
                sc = simulate(topo, WindowConfig(faults=spec, seed=seed), params)
                yield Case("sim", f"{label}/{spec}/s{seed}", doc, sc.observations, sc.truth,
                           {"topology": label, "faults": spec})
                seed += 1


def gen2_cases(count: int, first_seed: int = 0) -> Iterator[Case]:
    for seed in range(first_seed, first_seed + count):
        sc = gen2.scenario(seed)
        yield Case("gen2", f"gen2/s{seed}", sc.topology, sc.observations, sc.truth, sc.info)


def _fault_kind(c: dict[str, Any]) -> str:
    return str(c.get("fault", c["kind"]))


@dataclass
class Tally:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    def add(self, tp: int, fp: int, fn: int) -> None:
        self.tp += tp
        self.fp += fp
        self.fn += fn

    def prf(self) -> tuple[float, float, float]:
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0
        r = self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        return p, r, f


@dataclass
class Result:
    overall: Tally = field(default_factory=Tally)
    by_class: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    recall_by_kind: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    network_ok_right: int = 0
    healthy: int = 0
    healthy_alarms: int = 0
    scenarios: int = 0
    seconds: float = 0.0
    bands: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    misses: list[str] = field(default_factory=list)


BANDS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01))


def score(result: Result, case: Case, verdict: Verdict, seconds: float, calibrate: bool) -> None:
    truth = {(c["kind"], c["name"]): _fault_kind(c) for c in case.truth["culprits"]}
    got = {(c.kind, c.name): c.confidence for c in verdict.culprits}
    tp = len(set(truth) & set(got))
    fp = len(set(got) - set(truth))
    fn = len(set(truth) - set(got))
    result.overall.add(tp, fp, fn)
    kinds = sorted(set(truth.values()))
    cls = "none" if not kinds else (kinds[0] if len(truth) == 1 else "several")
    result.by_class[cls].add(tp, fp, fn)
    for key, kind in truth.items():
        result.recall_by_kind[kind].add(int(key in got), 0, int(key not in got))
    result.network_ok_right += int(verdict.network_ok == case.truth["network_ok"])
    result.scenarios += 1
    result.seconds += seconds
    if not truth:
        result.healthy += 1
        result.healthy_alarms += int(bool(got))
    if calibrate:
        for key, conf in got.items():
            for lo, hi in BANDS:
                if lo <= conf < hi:
                    result.bands[f"{lo:.2f}-{min(hi, 1.0):.2f}"].add(int(key in truth), int(key not in truth), 0)
    if set(truth) != set(got):
        result.misses.append(f"{case.name}: missed {sorted(set(truth) - set(got))} "
                             f"extra {sorted((k, round(c, 3)) for k, c in got.items() if k not in truth)}")


def run(cases: Iterator[Case], methods: dict[str, Callable] = METHODS) -> dict[str, dict[str, Result]]:
    """Results per suite and method."""
    out: dict[str, dict[str, Result]] = defaultdict(lambda: defaultdict(Result))
    for case in cases:
        topo = parse_topology(case.topology)
        model = FabricModel(topo)
        window = parse_observations(case.observations, model.index)
        for name, fn in methods.items():
            t0 = time.process_time()
            verdict = fn(model, window)
            score(out[case.suite][name], case, verdict, time.process_time() - t0, name == "triangulation")
    return out


def table(results: dict[str, Result]) -> str:
    """Markdown: overall and per fault class, one column group per method."""
    names = list(results)
    classes = sorted({c for r in results.values() for c in r.by_class}, key=lambda c: (c in ("none", "several"), c))
    head = "| fault class | scenarios | " + " | ".join(f"{n} P / R / F1" for n in names) + " |"
    lines = [head, "|" + " --- |" * (2 + len(names))]
    first = results[names[0]]
    for cls in classes:
        cells = []
        for n in names:
            t = results[n].by_class.get(cls, Tally())
            p, r, f = t.prf()
            cells.append(f"{p:.3f} / {r:.3f} / {f:.3f}" if cls != "none" else f"{t.fp} false culprits")
        count = first.by_class[cls].tp + first.by_class[cls].fn
        lines.append(f"| {cls} | {count} faults | " + " | ".join(cells) + " |")
    cells = []
    for n in names:
        p, r, f = results[n].overall.prf()
        cells.append(f"**{p:.3f} / {r:.3f} / {f:.3f}**")
    lines.append(f"| **all** | {first.scenarios} windows | " + " | ".join(cells) + " |")
    cells = [f"{results[n].network_ok_right}/{results[n].scenarios}" for n in names]
    lines.append("| network_ok right | | " + " | ".join(cells) + " |")
    cells = [f"{results[n].healthy_alarms}/{results[n].healthy}" for n in names]
    lines.append("| healthy windows with a culprit | | " + " | ".join(cells) + " |")
    cells = [f"{results[n].seconds / max(results[n].scenarios, 1) * 1e3:.0f} ms" for n in names]
    lines.append("| CPU per window (mean) | | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recall_table(results: dict[str, Result]) -> str:
    names = list(results)
    kinds = sorted({k for r in results.values() for k in r.recall_by_kind})
    lines = ["| fault kind | faults | " + " | ".join(f"{n} recall" for n in names) + " |",
             "|" + " --- |" * (2 + len(names))]
    for k in kinds:
        t0 = results[names[0]].recall_by_kind[k]
        cells = [f"{results[n].recall_by_kind[k].prf()[1]:.3f}" for n in names]
        lines.append(f"| {k} | {t0.tp + t0.fn} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_table(result: Result) -> str:
    lines = ["| confidence | culprits | precision |", "| --- | --- | --- |"]
    for band in sorted(result.bands):
        t = result.bands[band]
        lines.append(f"| {band} | {t.tp + t.fp} | {t.tp / max(t.tp + t.fp, 1):.3f} |")
    return "\n".join(lines)


def main(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    suites: list[Iterator[Case]] = []
    if args.sim:
        suites.append(sim_cases(args.sim))
    if args.gen2:
        suites.append(gen2_cases(args.gen2, args.gen2_seed))
    report = []
    summary = {}
    for cases in suites:
        res = run(cases)
        for suite, by_method in res.items():
            report.append(f"### suite {suite}\n\n{table(by_method)}\n\nRecall per fault kind:\n\n"
                          f"{recall_table(by_method)}\n\nCalibration of the triangulation:\n\n"
                          f"{calibration_table(by_method['triangulation'])}\n")
            summary[suite] = {m: dict(zip(("precision", "recall", "f1"), r.overall.prf(), strict=True))
                              | {"scenarios": r.scenarios, "misses": r.misses}
                              for m, r in by_method.items()}
            print(report[-1], flush=True)
    (out / "accuracy.md").write_text("\n".join(report))
    (out / "accuracy.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'accuracy.md'} and accuracy.json in {time.time() - t0:.0f} s")
    return 0
