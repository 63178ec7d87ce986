"""The runtime's steady-state cost measured inside one job: blocks of steps alternate between the
runtime as it is and a bypass, so the machine's drift (which moves whole runs by ±10 % on a
shared 2-vCPU VM) weighs on both alike.

``python -m bench.goodput.blocks [--rounds 20] [--block 40]``: ``bench/goodput/train.py`` (4 ranks,
gloo, DDP, AdamW) under ``lockstep run``, with a copy of ``lockstep/`` patched for the benchmark
only (the runtime carries no benchmark switch): after ``--warmup`` steps, blocks of ``--block``
steps alternate (ABBA rounds) between

* ``runtime`` -- every gradient bucket through ``ResilientProcessGroup`` (input copy, sequence,
  completion), the three small-state writes a step;
* ``bypass``  -- the gradient buckets straight to a second, plain gloo group of the same members
  (what a plain torchrun job runs) and no small-state writes; the optimizer hooks still run.

Rank 0's wall time and every rank's CPU time (``time.process_time``) are taken per block. Output:
per-mode medians, the runtime's cost against the bypass paired within each round (median and
quartiles over the rounds), and ``results-blocks.json``. The whole-job A/B against plain
torchrun (start-up, helpers) is ``bench.goodput.overhead``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(sys.executable).parent

_MODE_FN = '''
import os as _os

BENCH_BLOCK = int(_os.environ["BENCH_BLOCK"])
BENCH_WARMUP = int(_os.environ["BENCH_WARMUP"])


def bench_bypass(step_no):
    """Whether step ``step_no`` runs in a bypass block (rounds: runtime, bypass, bypass, runtime)."""
    if step_no < BENCH_WARMUP:
        return False
    block = (step_no - BENCH_WARMUP) // BENCH_BLOCK
    return (block % 4) in (1, 2)


# A collective key'''

# (file, anchor, replacement): each anchor must occur once in the runtime as it is.
PATCHES = [
    ("runtime/patches.py", "    def build(generation: int):", "    def build(generation: int, variant: str = \"\"):"),
    ("runtime/patches.py", 'dist.PrefixStore(f"lockstep/{group_id}/gen{generation}/", base)',
     'dist.PrefixStore(f"lockstep/{group_id}/gen{generation}{variant}/", base)'),
    ("runtime/group.py", "# A collective key", _MODE_FN),
    ("runtime/group.py", "        opts = opts or dist.AllreduceOptions()\n        saved = _clone_list(tensors)\n",
     "        opts = opts or dist.AllreduceOptions()\n"
     "        if bench_bypass(self._runtime.step_no) and torch._C._current_graph_task_id() != -1:\n"
     "            return self._bench_plain.allreduce(tensors, opts)\n"
     "        saved = _clone_list(tensors)\n"),
    ("runtime/group.py", "                backend = self._factory(generation)\n",
     "                backend = self._factory(generation)\n"
     "                self._bench_plain = self._factory(generation, \"plain\")\n"),
    ("runtime/context.py", "        if self._writers is None:\n            return\n",
     "        if self._writers is None:\n            return\n"
     "        from lockstep.runtime.group import bench_bypass\n"
     "        if bench_bypass(self.step_no):\n            return\n"),
    ("runtime/context.py", "        with self._boundary_cv:\n            self.step_no += 1\n",
     "        from lockstep.runtime.group import BENCH_BLOCK, BENCH_WARMUP, bench_bypass\n"
     "        if self.step_no + 1 >= BENCH_WARMUP and (self.step_no + 1 - BENCH_WARMUP) % BENCH_BLOCK == 0:\n"
     "            t, c = time.perf_counter(), time.process_time()\n"
     "            if getattr(self, '_bench_block', None) is not None:\n"
     "                self._original_stderr.write(f'BENCHBLOCK {self.rank} {int(bench_bypass(self.step_no))} '\n"
     "                                            f'{t - self._bench_block[0]:.6f} {c - self._bench_block[1]:.6f}\\n')\n"
     "                self._original_stderr.flush()\n"
     "            self._bench_block = (t, c)\n"
     "        with self._boundary_cv:\n            self.step_no += 1\n"),
]


def patched_copy(dest: Path) -> Path:
    shutil.copytree(ROOT / "lockstep", dest / "lockstep", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, anchor, replacement in PATCHES:
        path = dest / "lockstep" / rel
        text = path.read_text()
        if text.count(anchor) != 1:
            raise SystemExit(f"bench.goodput.blocks: lockstep/{rel} no longer has its anchor once: {anchor!r}")
        path.write_text(text.replace(anchor, replacement))
    return dest


def parse(log: str, block: int) -> list[dict]:
    """One row per block: mode, rank 0's wall per step, the ranks' CPU per step."""
    per_rank: dict[int, list[tuple[int, float, float]]] = {}
    for m in re.finditer(r"BENCHBLOCK (\d+) ([01]) ([0-9.]+) ([0-9.]+)", log):  # lines of ranks may interleave
        per_rank.setdefault(int(m[1]), []).append((int(m[2]), float(m[3]), float(m[4])))
    n = min(len(v) for v in per_rank.values())
    rows = []
    for k in range(n):
        modes = {per_rank[r][k][0] for r in per_rank}
        if len(modes) != 1:
            raise SystemExit(f"block {k}: the ranks disagree on its mode ({modes})")
        rows.append({"mode": "bypass" if modes.pop() else "runtime",
                     "wall_ms": per_rank[0][k][1] / block * 1e3,
                     "cpu_ms": sum(per_rank[r][k][2] for r in per_rank) / block * 1e3})
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {}
    for mode in ("runtime", "bypass"):
        sel = [r for r in rows if r["mode"] == mode]
        out[mode] = {"blocks": len(sel), "wall_ms": statistics.median(r["wall_ms"] for r in sel),
                     "cpu_ms": statistics.median(r["cpu_ms"] for r in sel)}
    wall, cpu = [], []
    for i in range(0, len(rows) - 3, 4):  # a round: runtime, bypass, bypass, runtime
        rnd = rows[i:i + 4]
        rt = [r for r in rnd if r["mode"] == "runtime"]
        by = [r for r in rnd if r["mode"] == "bypass"]
        wall.append(sum(r["wall_ms"] for r in rt) / sum(r["wall_ms"] for r in by) - 1)
        cpu.append(sum(r["cpu_ms"] for r in rt) / sum(r["cpu_ms"] for r in by) - 1)

    def quartiles(xs):
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        return {"median": statistics.median(xs), "q1": q[0], "q3": q[2]}

    out["rounds"] = len(wall)
    out["wall_overhead"] = quartiles(wall)
    out["cpu_overhead"] = quartiles(cpu)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.goodput.blocks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="ABBA rounds of blocks (default 20)")
    ap.add_argument("--block", type=int, default=40, help="steps per block (default 40)")
    ap.add_argument("--warmup", type=int, default=200, help="steps before the first block")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default=str(HERE / "results-blocks.json"))
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-blocks-"))
    try:
        patched_copy(tmp)
        steps = a.warmup + (4 * a.rounds + 1) * a.block
        env = dict(os.environ, PYTHONPATH=str(tmp), LOCKSTEP_STATE_DIR=str(tmp / "state"), PYTHONUNBUFFERED="1",
                   BENCH_BLOCK=str(a.block), BENCH_WARMUP=str(a.warmup))
        cmd = [str(BIN / "lockstep"), "run", "--job", f"blocks-{os.getpid()}", "--spares", "1", "--",
               "torchrun", "--nproc-per-node", "4", str(HERE / "train.py"), str(tmp / "out.pt"),
               "--steps", str(steps), "--width", str(a.width), "--batch", str(a.batch)]
        load0 = os.getloadavg()
        print(f"blocks A/B inside one job: {a.rounds} rounds of 4 x {a.block} steps after {a.warmup}; "
              f"width {a.width}, batch {a.batch}; {platform.node()} {os.cpu_count()} cores; load {load0[0]:.2f}",
              flush=True)
        # cwd: not the checkout, whose lockstep/ would shadow the copy (python -m puts the cwd first)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp, timeout=3600)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise SystemExit(f"the job failed (exit {proc.returncode}):\n{log[-4000:]}")
        rows = parse(log, a.block)
        summary = summarize(rows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for mode in ("runtime", "bypass"):
        s = summary[mode]
        print(f"  {mode:8s} {s['blocks']} blocks: {s['wall_ms']:.2f} ms/step wall, {s['cpu_ms']:.2f} ms CPU/step (4 ranks)")
    w, c = summary["wall_overhead"], summary["cpu_overhead"]
    print(f"  runtime vs bypass, paired in {summary['rounds']} rounds: wall {w['median'] * 100:+.1f} % "
          f"(quartiles {w['q1'] * 100:+.1f} .. {w['q3'] * 100:+.1f}), CPU {c['median'] * 100:+.1f} % "
          f"(quartiles {c['q1'] * 100:+.1f} .. {c['q3'] * 100:+.1f})")
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.node()} {os.cpu_count()} cores",
           "load": [round(x, 2) for x in (load0 + os.getloadavg())], "config": vars(a), "summary": summary, "blocks": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"  results in {a.out}")


if __name__ == "__main__":
    main()
