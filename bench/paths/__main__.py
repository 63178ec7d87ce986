"""Benchmark of ECMP path computation (workers/fabric/paths.py) and window simulation
(testbed/simulate) on the 9,216-GPU fabrics.

    python -m bench.paths                 # all presets below, results as a Markdown table
    python -m bench.paths --preset gpu9216 --repeat 3

Each number is the best of --repeat runs, measured cold (a fresh PathIndex per run) unless said.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from testbed.simulate.topology import PRESETS, generate_topology
from testbed.simulate.window import WindowConfig, choose_pairs, simulate, switch_pods
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} CPUs visible, Python {platform.python_version()}, "
            f"numpy {np.__version__}, {platform.system()} {platform.release()}")


def bench_preset(name: str, repeat: int) -> list[tuple[str, str]]:
    params = PRESETS[name][0]
    rows: list[tuple[str, str]] = []
    t, doc = best(lambda: generate_topology(params), repeat)
    c = params.counts()
    rows.append(("fabric", f"{c['nics']} NICs, {c['leaves']} leaves, {c['spines']} spines, {c['cores']} cores, "
                           f"{c['links']} links"))
    rows.append(("generate topology document", f"{t * 1e3:.0f} ms"))
    t, topo = best(lambda: parse_topology(doc), repeat)
    rows.append(("parse_topology (given parser)", f"{t * 1e3:.0f} ms"))
    t, _ = best(lambda: PathIndex(topo), repeat)
    rows.append(("PathIndex(topology)", f"{t * 1e3:.0f} ms"))
    leaves = sorted({int(s) for s in PathIndex(topo).nic_switch})

    def all_roots():
        idx = PathIndex(topo)
        for r in leaves:
            idx._root(r)
        return idx

    t, idx = best(all_roots, repeat)
    rows.append((f"BFS layers + path counts from all {len(leaves)} leaves (cold)", f"{t * 1e3:.0f} ms"))

    rng = np.random.default_rng(0)
    names = idx.nic_names
    sample = [(names[a], names[b]) for a, b in rng.integers(len(names), size=(2000, 2)) if a != b]
    t, counts = best(lambda: [idx.count_paths(s, d) for s, d in sample], repeat)
    rows.append(("count_paths, one pair at a time (warm)", f"{t / len(sample) * 1e6:.1f} us/pair "
                 f"(max {max(counts)} paths)"))
    far = (names[0], names[-1])
    n_far = idx.count_paths(*far)

    def enumerate_cold():
        fresh = PathIndex(topo)
        return fresh.paths(*far)

    t, _ = best(enumerate_cold, repeat)
    rows.append((f"paths() of a farthest pair, {n_far} paths (cold index)", f"{t * 1e3:.1f} ms"))
    t, _ = best(lambda: idx.paths(*far), repeat)
    rows.append(("paths() of the same pair (cached switch pair)", f"{t * 1e3:.2f} ms"))

    config = WindowConfig(seed=1)
    src, dst = choose_pairs(idx, switch_pods(topo, idx), config, np.random.default_rng(1))
    pairs = [(names[s], names[d]) for s, d in zip(src.tolist(), dst.tolist(), strict=True)]
    t, inc = best(lambda: PathIndex(topo).incidence(pairs), repeat)
    rows.append((f"incidence() of a window's {len(pairs)} pairs (16 peers/NIC, cold)", f"{t * 1e3:.0f} ms"))
    inc = idx.incidence(pairs)
    t, _ = best(lambda: inc.loads(), repeat)
    rows.append(("loads(): traversals of every link and switch", f"{t * 1e3:.0f} ms"))
    ones = np.ones(len(idx.link_ids))
    t, _ = best(lambda: inc.mean_path_product(ones * 0.999, ones * 0.999), repeat)
    rows.append(("mean_path_product(): exact ECMP delivery of every pair", f"{t * 1e3:.0f} ms"))
    some = list(idx.link_ids[-10:])
    t, _ = best(lambda: inc.link_fractions(some, directed=True), repeat)
    rows.append(("link_fractions() of 10 links for every pair", f"{t * 1e3:.0f} ms"))
    t, _ = best(lambda: inc.sample_paths(np.random.default_rng(2)), repeat)
    rows.append(("sample_paths(): one uniform ECMP path per pair", f"{t * 1e3:.0f} ms"))

    t, scenario = best(lambda: simulate(topo, WindowConfig(faults="link_loss:1,switch_loss:1,host_loss:1",
                                                              seed=3)), repeat)
    rows.append(("simulate(): window with 3 faults and ground truth (parsed topology in)", f"{t:.2f} s"))
    with tempfile.TemporaryDirectory() as tmp:
        t, _ = best(lambda: scenario.write(tmp), repeat)
    rows.append(("write topology.json, observations.json, truth.json", f"{t:.2f} s"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paths", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS),
                        help="fabric to measure; repeatable (default: gpu9216 and gpu9216-2tier)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement, best kept (default 3)")
    args = parser.parse_args(argv)
    presets = args.preset or ["gpu9216", "gpu9216-2tier"]
    print(f"Date: {datetime.date.today().isoformat()}  ")
    print(f"Machine: {machine()}  ")
    print(f"Command: python -m bench.paths {' '.join(sys.argv[1:])}".rstrip())
    for name in presets:
        print(f"\n### {name} ({PRESETS[name][0].name})\n")
        print("| measurement | result |\n| --- | --- |")
        for what, value in bench_preset(name, args.repeat):
            print(f"| {what} | {value} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
