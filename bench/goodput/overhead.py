"""Steady-state overhead of ``lockstep run`` against plain torchrun, interleaved A/B.

``python -m bench.goodput.overhead [--repeats 3] [--steps 1200]``: the same job
(``bench/goodput/train.py``, the same torchrun arguments) alternately as

* ``plain``    -- ``torchrun --nproc-per-node 4 --master-port P train.py OUT ARGS``;
* ``lockstep`` -- ``lockstep run --job N --spares S -- torchrun --nproc-per-node 4 --master-port P
  train.py OUT ARGS``, no failure,

in the order plain, lockstep, lockstep, plain, plain, ... (ABBA: a drift in the machine's load
weighs on both alike). For each run, between the STEP line of step ``--warmup`` and the last
one, it reads from ``/proc``:

* the per-step wall time (median of the 20-step gaps rank 0 prints);
* the CPU time per step (user + system, ``/proc/PID/stat``) of the 4 ranks, and of every helper
  process of the variant: torchrun's agent for ``plain``; the node supervisor, the orchestrator
  and the warm spares and shadows for ``lockstep`` (``--spares 8``: one shadow per rank);
* the machine's CPU time per step outside both (``/proc/stat`` minus the job's processes): the
  load other users put on it while the run was measured.

On a machine whose cores the ranks already fill (4 ranks, 2 cores) every CPU-second beside them
is training time lost, so the CPU per step (ranks + helpers) is the overhead figure that a
loaded machine does not blur; the wall ratio is reported beside it. Output: a table and
``bench/goodput/results-overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(sys.executable).parent
TRAIN = HERE / "train.py"
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine (every core; idle and iowait excluded)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def proc_cpu_s(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK  # utime, stime (fields 14, 15)


def classify(cmd: bytes, env: bytes) -> str:
    if b"lockstep.runtime.spare" in cmd:
        return "spare"  # a warm spare, or one that became a shadow
    if b"\0LOCKSTEP_SHADOW=1" in b"\0" + env:
        return "shadow"
    if b"lockstep.orchestrator" in cmd:
        return "orchestrator"
    if b"\0RANK=" in b"\0" + env and b"train.py" in cmd:
        return "rank"
    if b"bin/lockstep\0" in cmd:
        return "supervisor"
    if b"torchrun" in cmd:
        return "torchrun agent"
    return "other"


def job_processes(marker: str) -> dict[int, str]:
    found = {}
    needle = f"BENCH_RUN={marker}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in env:
            found[int(name)] = classify(cmd, env)
    return found


class Run:
    def __init__(self, variant: str, cmd: list[str], warmup: int, steps: int, env: dict | None = None):
        self.variant = variant
        self.marker = uuid.uuid4().hex
        self.warmup = warmup
        self.steps_total = steps
        self.steps: list[tuple[int, float]] = []
        self.log: list[str] = []
        self.start_snap = None
        self.end_snap = None
        self.proc = subprocess.Popen(cmd, env=dict(os.environ, BENCH_RUN=self.marker, PYTHONUNBUFFERED="1", **(env or {})),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _snap(self, step: int):
        procs = self.procs if self.start_snap else job_processes(self.marker)
        self.procs = procs
        return {"step": step, "t": time.time(), "machine": machine_cpu_s(), "load": loadavg(),
                "cpu": {pid: proc_cpu_s(pid) for pid in procs}}

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            parts = line.split()
            if len(parts) == 3 and parts[0] == "STEP":
                n = int(parts[1])
                self.steps.append((n, float(parts[2])))
                if n == self.warmup:
                    self.start_snap = self._snap(n)
                elif n == self.steps_total and self.start_snap:
                    self.end_snap = self._snap(n)

    def result(self) -> dict:
        code = self.proc.wait()
        self.reader.join()
        if code != 0 or not self.start_snap or not self.end_snap:
            raise RuntimeError(f"{self.variant} failed (exit {code}):\n" + "".join(self.log[-40:]))
        a, b = self.start_snap, self.end_snap
        n = b["step"] - a["step"]
        per_kind: dict[str, float] = {}
        job_cpu = 0.0
        for pid, kind in self.procs.items():
            c0, c1 = a["cpu"].get(pid), b["cpu"].get(pid)
            if c0 is None or c1 is None:
                continue
            per_kind[kind] = per_kind.get(kind, 0.0) + (c1 - c0)
            job_cpu += c1 - c0
        pts = [p for p in self.steps if a["step"] <= p[0] <= b["step"]]
        gaps = [(q[1] - p[1]) / (q[0] - p[0]) for p, q in zip(pts, pts[1:], strict=False)]
        ms = {k: v / n * 1000 for k, v in per_kind.items()}
        helpers = sum(v for k, v in ms.items() if k != "rank")
        return {
            "variant": self.variant, "steps": n, "wall_s": b["t"] - a["t"],
            "step_ms": statistics.median(gaps) * 1000,
            "cpu_ms_per_step": ms, "rank_cpu_ms": ms.get("rank", 0.0), "helper_cpu_ms": helpers,
            "other_cpu_ms": ((b["machine"] - a["machine"]) - job_cpu) / n * 1000,
            "load": [a["load"], b["load"]],
            "processes": sorted(self.procs.values()),
        }


def job_args(a, out: Path) -> list[str]:
    return [str(TRAIN), str(out), "--steps", str(a.steps), "--width", str(a.width), "--batch", str(a.batch)]


def run_variant(variant: str, a, tmp: Path) -> dict:
    torchrun = ["torchrun", "--nproc-per-node", str(a.nproc), "--master-port", str(free_port())]
    name = f"ovh-{uuid.uuid4().hex[:8]}"
    if variant == "plain":
        cmd = [str(BIN / "torchrun"), *torchrun[1:], *job_args(a, tmp / f"{name}.pt")]
        env = {}
    else:
        cmd = [str(BIN / "lockstep"), "run", "--job", name, "--spares", str(a.spares), "--", *torchrun,
               *job_args(a, tmp / f"{name}.pt")]
        env = {"LOCKSTEP_STATE_DIR": str(tmp / "state")}
    # torchrun sets OMP_NUM_THREADS=1 for more than one rank (so does lockstep run); for one rank
    # too, so that the CPU time is not blurred by OpenMP's spinning threads.
    env = dict(env or {}, OMP_NUM_THREADS="1")
    return Run(variant, cmd, a.warmup, a.steps, env).result()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.goodput.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="pairs of runs (default 3)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--warmup", type=int, default=200, help="steps before the measured window (a multiple of 20)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nproc", type=int, default=4, help="ranks (--nproc-per-node); 1: the runtime's own cost "
                    "in one process, with nothing competing for the cores")
    ap.add_argument("--spares", type=int, default=1, help="lockstep run --spares (one warm spare is kept)")
    ap.add_argument("--out", default=str(HERE / "results-overhead.json"))
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    order = []
    for i in range(a.repeats):
        order += ["plain", "lockstep"] if i % 2 == 0 else ["lockstep", "plain"]
    print(f"overhead A/B: {a.nproc} ranks, {a.repeats} pairs, steps {a.warmup}..{a.steps}, width {a.width}, batch {a.batch}; "
          f"{platform.node()} {os.cpu_count()} cores; load {loadavg()}", flush=True)
    runs = []
    for variant in order:
        r = run_variant(variant, a, tmp)
        runs.append(r)
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["cpu_ms_per_step"].items()))
        print(f"  {variant:8s} {r['step_ms']:6.2f} ms/step wall; CPU ms/step: {kinds}; others on the machine "
              f"{r['other_cpu_ms']:.2f}; load {r['load'][0]} -> {r['load'][1]}", flush=True)

    def med(variant, key):
        return statistics.median(r[key] for r in runs if r["variant"] == variant)

    pairs = [(runs[i], runs[i + 1]) for i in range(0, len(runs), 2)]
    wall_ratios = []
    cpu_ratios = []
    for x, y in pairs:
        p, lk = (x, y) if x["variant"] == "plain" else (y, x)
        wall_ratios.append(lk["step_ms"] / p["step_ms"] - 1)
        cpu_ratios.append((lk["rank_cpu_ms"] + lk["helper_cpu_ms"]) / (p["rank_cpu_ms"] + p["helper_cpu_ms"]) - 1)
    summary = {
        "plain_step_ms": med("plain", "step_ms"), "lockstep_step_ms": med("lockstep", "step_ms"),
        "plain_rank_cpu_ms": med("plain", "rank_cpu_ms"), "lockstep_rank_cpu_ms": med("lockstep", "rank_cpu_ms"),
        "plain_helper_cpu_ms": med("plain", "helper_cpu_ms"), "lockstep_helper_cpu_ms": med("lockstep", "helper_cpu_ms"),
        "wall_overhead_per_pair": wall_ratios, "cpu_overhead_per_pair": cpu_ratios,
        "wall_overhead_median": statistics.median(wall_ratios), "cpu_overhead_median": statistics.median(cpu_ratios),
    }
    print(f"  wall per step: plain {summary['plain_step_ms']:.2f} ms, lockstep {summary['lockstep_step_ms']:.2f} ms; "
          f"per pair {', '.join(f'{x * 100:+.1f}%' for x in wall_ratios)} (median {summary['wall_overhead_median'] * 100:+.1f}%)")
    print(f"  CPU per step (4 ranks + helpers): plain {summary['plain_rank_cpu_ms']:.2f} + {summary['plain_helper_cpu_ms']:.2f} ms, "
          f"lockstep {summary['lockstep_rank_cpu_ms']:.2f} + {summary['lockstep_helper_cpu_ms']:.2f} ms; per pair "
          f"{', '.join(f'{x * 100:+.1f}%' for x in cpu_ratios)} (median {summary['cpu_overhead_median'] * 100:+.1f}%)")
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()} {os.cpu_count()} cores",
           "config": vars(a), "runs": runs, "summary": summary}
    Path(a.out).write_text(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"  results in {a.out}; load {loadavg()}")


if __name__ == "__main__":
    main()
