"""The collective bandwidth test: this node's ranks of a torch.distributed collective, bus
bandwidth computed as nccl-tests computes it, checked against the hardware threshold table.

The agent never imports torch: each local rank is a subprocess running
``collective_worker.py`` (a standalone script) under a Python that has torch (``python``
argument; default: the agent's own interpreter). The console starts the same command on every
participating node with the same ``init`` rendezvous, ``world_size`` and a ``rank_offset`` per
node (phase 2 orchestrates it); ``NCCL_*`` settings pin the test to a rail (``NCCL_IB_HCA``) or
force the ring algorithm (``NCCL_ALGO=Ring``, to measure the network on two nodes).

Bandwidth (nccl-tests ``doc/PERFORMANCE.md``): ``algbw = S / t`` in GB/s (1e9 bytes), with S the
nccl-tests size of the operation and t the time of one operation averaged over iterations and
ranks; ``busbw = algbw x factor``: all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall
(n-1)/n; broadcast, reduce 1. The check compares the bus bandwidth at the largest size with the
minimum (``min_busbw_gbs``, or the profile's ``collective[threshold]``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agent.audit.results import bad, ok, skip
from agent.audit.thresholds import profile as threshold_profile

FORMAT = "lockstep.audit.collective/v1"
WORKER = Path(__file__).with_name("collective_worker.py")
PYTHON_RE = re.compile(r"^/[A-Za-z0-9._/+-]*/python[0-9.]*$")
_ENV_RE = re.compile(r"^(NCCL|GLOO)_[A-Z0-9_]+$")
_INIT_RE = re.compile(r"^tcp://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):(\d{1,5})$")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor for an operation on n ranks."""
    if n < 1:
        raise ValueError(f"world size {n} must be at least 1")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"op {op!r}: use all_reduce, all_gather, reduce_scatter, alltoall, broadcast or reduce")


def bandwidth(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) of one operation of nccl-tests size `size_bytes`."""
    if seconds <= 0:
        raise ValueError("the time of an operation must be positive")
    algbw = size_bytes / 1e9 / seconds
    return algbw, algbw * bus_factor(op, n)


def evaluate(op: str, world: int, timings: list[dict], *, min_busbw_gbs: float | None,
             source: str = "") -> tuple[list[dict], dict]:
    """(per-size rows with algbw/busbw, the check's result) from the ranks' averaged timings."""
    rows = []
    for t in timings:
        if "error" in t:
            rows.append({"size": t["size"], "error": t["error"]})
            continue
        algbw, busbw = bandwidth(op, t["size"], t["time_s"], world)
        rows.append({"size": t["size"], "count": t.get("count"), "time_us": round(t["time_s"] * 1e6, 2),
                     "algbw_gbs": round(algbw, 6), "busbw_gbs": round(busbw, 6),
                     "busbw_slowest_rank_gbs": round(bandwidth(op, t["size"], t["time_s_max"], world)[1], 6)})
    comp = {"kind": "collective", "name": f"{op} x{world}"}
    good = [r for r in rows if "error" not in r]
    if not good:
        errors = "; ".join(r["error"] for r in rows) or "no size measured"
        return rows, bad("collective.busbw", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                         f"The collective did not run: {errors}.", "Check the ranks' errors.").to_dict()
    largest = max(good, key=lambda r: r["size"])
    ev = {"busbw_gbs": largest["busbw_gbs"], "size": largest["size"],
          "avg_busbw_gbs": round(sum(r["busbw_gbs"] for r in good) / len(good), 6)}
    if min_busbw_gbs is None:
        return rows, skip("collective.busbw", comp, "No bandwidth threshold for this hardware.").to_dict() | {
            "evidence": ev}
    th = {"min_busbw_gbs": min_busbw_gbs} | ({"source": source} if source else {})
    if largest["busbw_gbs"] < min_busbw_gbs:
        return rows, bad("collective.busbw", comp, "fail", "DCGM_FR_LOW_BANDWIDTH", "triage",
                         f"{op} bus bandwidth {largest['busbw_gbs']:.3f} GB/s at {largest['size']} bytes, below "
                         f"{min_busbw_gbs:g} GB/s.",
                         "Find the slow element: run the per-rail test and the fabric load; check NVLink and PCIe.",
                         ev, th).to_dict()
    return rows, ok("collective.busbw", comp, f"{op} bus bandwidth {largest['busbw_gbs']:.3f} GB/s.", ev, th).to_dict()


def run(args: dict, *, cancelled: threading.Event | None = None) -> dict:
    """Start this node's ranks, wait for them, and report (the ``audit.collective`` handler)."""
    cancelled = cancelled or threading.Event()
    python = args.get("python") or sys.executable
    if python != sys.executable and (not PYTHON_RE.match(python) or not os.path.isfile(python)):
        raise ValueError(f"argument python {python!r} must be the absolute path of an existing python interpreter")
    m = _INIT_RE.match(args.get("init", ""))
    if not m or not 0 < int(m.group(1)) < 65536:
        raise ValueError(f"argument init {args.get('init')!r} must be tcp://ADDRESS:PORT with a port below 65536")
    env_extra = args.get("env") or {}
    for key, value in env_extra.items():
        if not _ENV_RE.match(key) or not isinstance(value, str):
            raise ValueError(f"argument env: {key!r} is not an NCCL_* or GLOO_* setting with a string value")
    world, offset, local = int(args["world_size"]), int(args.get("rank_offset", 0)), int(args.get("local_ranks", 1))
    if offset + local > world:
        raise ValueError(f"ranks {offset}..{offset + local - 1} do not fit in world_size {world}")
    backend = args.get("backend", "gloo")
    ifname = args.get("ifname")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LD_LIBRARY_PATH", "CUDA_HOME")}
    env |= {"OMP_NUM_THREADS": "1", **env_extra}
    if ifname:
        env |= {"GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname}
    sizes = ",".join(str(int(s)) for s in args["sizes"])
    procs = []
    started = time.time()
    for i in range(local):
        device = f"cuda:{i}" if backend == "nccl" else "cpu"
        argv = [python, str(WORKER), "--init", args["init"], "--rank", str(offset + i), "--world", str(world),
                "--backend", backend, "--op", args.get("op", "all_reduce"), "--sizes", sizes,
                "--iters", str(args.get("iters", 20)), "--warmup", str(args.get("warmup", 5)),
                "--dtype", args.get("dtype", "float32"), "--device", device,
                "--timeout-s", str(args.get("timeout_s", 300))]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,  # noqa: S603
                                      text=True))
    deadline = started + float(args.get("timeout_s", 300)) + 30
    outputs, errors = [], []
    for rank, proc in enumerate(procs, start=offset):
        while proc.poll() is None and time.time() < deadline and not cancelled.is_set():
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        stdout, stderr = proc.communicate()
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (stderr or "").strip().splitlines()[-3:]
            errors.append(f"rank {rank} exited {proc.returncode}: {' | '.join(tail) or 'no output'}")
            continue
        outputs.append(json.loads(lines[-1]))
    op = args.get("op", "all_reduce")
    threshold_key = args.get("threshold")
    minimum = args.get("min_busbw_gbs")
    source = "argument min_busbw_gbs" if minimum is not None else ""
    if minimum is None and threshold_key:
        table = threshold_profile(args.get("hardware") or "generic").get("collective", {})
        minimum = table.get(threshold_key)
        source = f"{args.get('hardware')}.collective.{threshold_key}"
    if outputs:
        rows, check = evaluate(op, world, outputs[0]["results"], min_busbw_gbs=minimum, source=source)
    else:
        rows, check = [], bad("collective.busbw", {"kind": "collective", "name": f"{op} x{world}"}, "error",
                              "DCGM_FR_CANNOT_GET_STAT", "triage", "No rank of this node finished: "
                              + "; ".join(errors), "Check torch, the rendezvous address and the ranks' errors.").to_dict()
    info: dict[str, Any] = outputs[0] if outputs else {}
    return {"format": FORMAT, "op": op, "backend": backend, "world_size": world,
            "ranks": list(range(offset, offset + local)), "dtype": args.get("dtype", "float32"),
            "torch": info.get("torch"), "nccl": info.get("nccl"), "sizes": rows, "check": check,
            "status": check["status"], "seconds": round(time.time() - started, 3), "errors": errors}
