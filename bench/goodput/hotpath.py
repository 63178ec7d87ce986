"""The runtime's CPU per training step in one process, with nothing of the job around it.

``python -m bench.goodput.hotpath [--pairs 3] [--steps 1000]``: ``bench/goodput/train.py``'s MLP
(DDP, AdamW, dropout) trained in one process on a one-member gloo group, alternately

* ``plain``    -- as torch runs it;
* ``lockstep`` -- with the runtime installed as ``lockstep run`` installs it (``patches.install``:
  the ``ResilientProcessGroup`` wrapper DDP's reducer goes through, the optimizer hooks, the
  three small-state slot writes a step into a node directory in ``/dev/shm``),

and reports the CPU time per step of the process (every thread: ``time.process_time``) and of
its main thread (``time.thread_time``), medians over blocks of 100 steps. CPU time, unlike wall
time, is inflated by other processes' load only through the caches, and both variants run
alternately in the same minutes. In ``lockstep`` mode it also times the three slot writes and
the optimizer hooks alone. The job-level A/B (4 ranks, wall and CPU, the helper processes) is
``bench.goodput.overhead``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

def minor_faults() -> int:
    """Page faults served without I/O (a fresh allocation's pages): a count no load changes."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def worker(a):
    shm = "/dev/shm"  # noqa: S108 (where lockstep run keeps the slots; mkdtemp makes a private directory)
    node_dir = tempfile.mkdtemp(prefix="lockstep-hotpath-", dir=shm if os.path.isdir(shm) else None)
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCKSTEP_NODE_DIR": node_dir,
                       "LOCKSTEP_ROLE": "worker"})
    os.environ.pop("LOCKSTEP_ORCHESTRATOR", None)
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench.goodput.train import build_model

    rt = None
    if a.mode == "lockstep":
        from lockstep.runtime import context, patches
        from lockstep.runtime.context import Runtime

        rt = context.RUNTIME = Runtime(dict(os.environ))
        patches.install(rt)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    w = a.width
    model = build_model(w)  # the benchmark job's own model
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator()

    def train_step(step):
        gen.manual_seed(step * 1000)
        torch.manual_seed(step * 7919)
        x = torch.randn(a.batch, 128, generator=gen)
        y = torch.randn(a.batch, 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def timed(fn, n):
        p0, t0 = time.process_time(), time.thread_time()
        for _ in range(n):
            fn()
        return (time.process_time() - p0) / n * 1e6, (time.thread_time() - t0) / n * 1e6

    step = [0]

    def one_step():
        train_step(step[0])
        step[0] += 1

    for _ in range(50):  # DDP rebuilds its buckets after the first step; warm caches
        one_step()
    out = {"process": [], "thread": [], "small": [], "hooks": [], "faults": []}
    for _ in range(max(1, a.steps // 100)):
        f0 = minor_faults()
        p, t = timed(one_step, 100)
        out["faults"].append((minor_faults() - f0) / 100)
        out["process"].append(p)
        out["thread"].append(t)
        if rt is not None:
            out["small"].append(timed(lambda: [rt._write_small(k) for k in ("mid", "pre", "post")], 100)[1])
            out["hooks"].append(timed(lambda: (rt.on_pre_step(opt), rt.on_post_step(opt)), 100)[1])
    print(json.dumps({k: statistics.median(v) for k, v in out.items() if v}), flush=True)
    shutil.rmtree(node_dir, ignore_errors=True)
    os._exit(0)  # no teardown of the gloo group and its threads: nothing to report from it


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.goodput.hotpath", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000, help="measured steps per run (blocks of 100)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mode", choices=["plain", "lockstep"], help=argparse.SUPPRESS)  # one run (internal)
    a = ap.parse_args(argv)
    if a.mode:
        worker(a)
        return

    def load():
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])

    print(f"hotpath: {a.pairs} pairs of {a.steps} steps, width {a.width}, batch {a.batch}; load {load()}", flush=True)
    runs = {"plain": [], "lockstep": []}
    for i in range(a.pairs):
        for mode in (("plain", "lockstep") if i % 2 == 0 else ("lockstep", "plain")):
            cmd = [sys.executable, "-m", "bench.goodput.hotpath", "--mode", mode, "--steps", str(a.steps),
                   "--width", str(a.width), "--batch", str(a.batch)]
            env = dict(os.environ, OMP_NUM_THREADS="1")
            res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True,
                                        cwd=ROOT).stdout.splitlines()[-1])
            runs[mode].append(res)
            extra = f", slot writes x3 {res['small']:.1f} us, optimizer hooks {res['hooks']:.1f} us" if "small" in res else ""
            print(f"  {mode:8s} process {res['process']:8.1f} us/step, main thread {res['thread']:8.1f} us/step, "
                  f"{res['faults']:.1f} page faults/step{extra}; "
                  f"load {load()}", flush=True)
    ratios = [lk["process"] / p["process"] - 1 for p, lk in zip(runs["plain"], runs["lockstep"], strict=True)]
    tratios = [lk["thread"] / p["thread"] - 1 for p, lk in zip(runs["plain"], runs["lockstep"], strict=True)]
    print(f"  CPU per step, lockstep vs plain: process {', '.join(f'{r * 100:+.1f}%' for r in ratios)} "
          f"(median {statistics.median(ratios) * 100:+.1f}%); main thread "
          f"{', '.join(f'{r * 100:+.1f}%' for r in tratios)} (median {statistics.median(tratios) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
