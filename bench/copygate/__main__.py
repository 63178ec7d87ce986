"""What the bound on the off-node copy's lag (``lockstep/runtime/offnode``) costs a step.

Two parts, one command (``python -m bench.copygate``):

1. the fast path every step of a multi-node job pays, in this process: the rank's wake of its
   supervisor's forwarder after ``post`` (``Written.touch``; a model whose forward pass changes
   its buffers pays a second one after ``mid``) and the gate's check at the first gradient
   collective when the copy is already held (``CopyGate.wait``);
2. a real two-node job on this machine (two ``lockstep run`` processes, 2 ranks each, the goodput
   benchmark's DDP MLP): how many steps the gate held and for how long in all (each rank says
   so at exit), against the job's step time.

Writes ``results-<date>.json`` beside this file and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path

from lockstep.runtime import offnode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(sys.executable).parent


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def fast_path(n: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        state = offnode.CopyState(d, 0)
        forwarder = offnode.Written(d, create=True)
        rank = offnode.Written(d, create=False)
        gate = offnode.CopyGate(d, 0, say=print)
        state.set(gate=True, post=1 << 40, mid=1 << 40)
        del forwarder
        counter = iter(range(1 << 62))

        def step():
            rank.touch(0, next(counter))  # after post(k)
            gate.wait(5, False)  # at the first gradient collective of step k + 1

        per = min(timeit.repeat(step, number=n, repeat=5)) / n
        assert gate.waits == 0
        return {"per_step_us": round(per * 1e6, 2), "calls": n}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_node_job(steps: int, width: int, tree: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        name = f"copygate-{uuid.uuid4().hex[:8]}"
        env = dict(os.environ, LOCKSTEP_STATE_DIR=str(Path(tmp) / "state"), PYTHONUNBUFFERED="1")
        # The other variant's lockstep package: from its directory, ``python -m`` finds it first.
        cwd = tree or str(ROOT)
        port = free_port()
        procs = []
        t0 = time.time()
        for node in (0, 1):
            cmd = [str(BIN / "lockstep"), "run", "--job", name, "--spares", "0", "--", "torchrun", "--nnodes", "2",
                   "--node-rank", str(node), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                   "--master-port", str(port), str(ROOT / "bench/goodput/train.py"), str(Path(tmp) / "out.pt"),
                   "--steps", str(steps), "--width", str(width)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
        wall = time.time() - t0
        codes = [p.returncode for p in procs]
    text = "".join(outs)
    stamps = [(int(m[1]), float(m[2])) for m in re.finditer(r"^STEP (\d+) ([0-9.]+)$", text, re.M)]
    gates = [(int(m[1]), int(m[2]), int(m[3]), float(m[4])) for m in re.finditer(
        r"\[lockstep rank (\d+)\] off-node copy: (\d+) of (\d+) steps waited for it, ([0-9.]+) ms", text)]
    step_s = (stamps[-1][1] - stamps[0][1]) / (stamps[-1][0] - stamps[0][0]) if len(stamps) > 1 else None
    return {"exit": codes, "wall_s": round(wall, 2), "step_ms": round(step_s * 1e3, 3) if step_s else None,
            "ranks": [{"rank": r, "waited_steps": w, "checked_steps": c, "waited_ms": ms} for r, w, c, ms in sorted(gates)],
            "waited_ms_per_step": round(max((ms / c for _, _, c, ms in gates), default=0.0), 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.copygate")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=1, help="two-node runs per variant, interleaved")
    ap.add_argument("--compare-tree", help="a directory holding another lockstep package (for instance this "
                    "checkout with the gate taken out; the jobs run from it, so its package is the one "
                    "imported): its two-node runs alternate with this one's")
    a = ap.parse_args(argv)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": load(),
           "config": vars(a), "fast_path": fast_path(a.calls), "two_node_job": [], "compare_tree": []}
    for _ in range(a.repeat):
        res["two_node_job"].append(two_node_job(a.steps, a.width) | {"load": load()})
        if a.compare_tree:
            res["compare_tree"].append(two_node_job(a.steps, a.width, a.compare_tree) | {"load": load()})
    res["load_after"] = load()
    steps_ms = [r["step_ms"] for r in res["two_node_job"] if r["step_ms"]]
    if steps_ms:
        res["fast_path_share_of_step"] = round(res["fast_path"]["per_step_us"] / 1e3 / min(steps_ms), 6)
    out = HERE / f"results-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    runs = res["two_node_job"] + res["compare_tree"]
    return 0 if all(c == 0 for r in runs for c in r["exit"]) else 1


if __name__ == "__main__":
    sys.exit(main())
