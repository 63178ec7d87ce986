"""Localization time of one window on the large simulated fabrics.

    python -m bench.triangulation speed [--presets gpu1024,gpu9216] [--repeat 5]

Per preset: one window from testbed.simulate (16 peers per NIC, 1,000 probes per pair, 30% of
the pairs with a known path, the faults of --faults, noisy hosts as the model draws them), then
the best of --repeat runs of each step, CPU time of this process (time.process_time, which
counts every thread) and wall time: parsing the window (`parse_observations`), localizing it
with a warm `FabricModel` (the cache a console worker keeps per topology), and the same with a
cold model (a fresh FabricModel: BFS of every root and the route-class incidence included).

Warm means what a console worker has when the window arrives: a FabricModel that has
localized the previous window of the same probe plan, not this one. Each warm run gets a
fresh model that first localizes (untimed) a window of the same pairs with other faults
(`--previous-faults`; testbed.simulate keeps the pairs and paths of a seed whatever the
faults), so nothing computed from this window's numbers is reused.
"""

from __future__ import annotations

import datetime
import os
import platform
import time

import numpy as np
import scipy

from testbed.simulate.topology import PRESETS, generate_topology
from testbed.simulate.window import WindowConfig, simulate
from workers.fabric.observations import parse_observations
from workers.fabric.topology import parse_topology
from workers.triangulation import FabricModel, triangulate


def _best(fn, repeat: int):
    best_cpu, best_wall, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return best_cpu, best_wall, out


def machine() -> str:
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}, "
            f"scipy {scipy.__version__}, {platform.system()} {platform.release()}")


def main(args) -> int:
    print(f"date: {datetime.date.today()}; machine: {machine()}; load before: {os.getloadavg()}")
    rows = []
    for name in args.presets.split(","):
        topo = parse_topology(generate_topology(PRESETS[name][0]))
        sc = simulate(topo, WindowConfig(faults=args.faults, seed=11))
        previous = simulate(topo, WindowConfig(faults=args.previous_faults, seed=11))
        model = FabricModel(topo)
        pc, pw, window = _best(lambda m=model, s=sc: parse_observations(s.observations, m.index), args.repeat)
        best_cpu, best_wall, verdict = float("inf"), float("inf"), None
        for _ in range(args.repeat):
            model = FabricModel(topo)
            model.warm()
            triangulate(model, previous.observations)
            c, w, verdict = _best(lambda m=model, w=window: triangulate(m, w), 1)
            best_cpu, best_wall = min(best_cpu, c), min(best_wall, w)
        lc, lw = best_cpu, best_wall
        cc, cw, _ = _best(lambda t=topo, w=window: triangulate(FabricModel(t), w), max(1, args.repeat // 2))
        truth = sorted((c["kind"], c["name"]) for c in sc.truth["culprits"])
        got = sorted((c.kind, c.name) for c in verdict.culprits)
        rows.append((name, len(topo.nics), len(window), pc, pw, lc, lw, cc, cw, truth == got))
        print(f"{name}: {len(topo.nics)} NICs, {len(window)} pairs; parse {pc:.3f}s cpu / {pw:.3f}s wall; "
              f"localize warm {lc:.3f}s cpu / {lw:.3f}s wall; cold {cc:.3f}s cpu / {cw:.3f}s wall; "
              f"verdict {'= truth' if truth == got else f'{got} != truth {truth}'}", flush=True)
    print(f"load after: {os.getloadavg()}")
    print("\n| fabric | NICs | pairs | parse window (CPU / wall) | localize, warm model (CPU / wall) | "
          "localize, cold model (CPU / wall) | verdict = truth |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, nics, pairs, pc, pw, lc, lw, cc, cw, ok in rows:
        print(f"| {name} | {nics:,} | {pairs:,} | {pc:.2f} s / {pw:.2f} s | {lc:.2f} s / {lw:.2f} s | "
              f"{cc:.2f} s / {cw:.2f} s | {'yes' if ok else 'no'} |")
    return 0
