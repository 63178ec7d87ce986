"""Checkpoint stall: how long the training loop is blocked per checkpoint, in one run, same model.

    python -m bench.checkpoint                     # ~705 MB of state (58.7M-param MLP + AdamW), 4 checkpoints each
    python -m bench.checkpoint --checkpoints 6 --dir /mnt/nvme/bench --json results.json

Methods, each on the same model at the same step, one after another in this process:

- ``lockstep``: ``lockstep.checkpoint.save`` (shared-memory arena, background process, DCP format)
- ``dcp-thread``: ``dcp.async_save`` with the default thread executor
- ``dcp-process``: ``dcp.async_save(async_checkpointer_type=PROCESS)`` (the persistent-process mode)
- ``dcp-process-stager``: PROCESS plus a ``DefaultStager`` kept across saves (cached staging
  buffers in shared memory); on CPU ``use_pinned_memory``/``use_non_blocking_copy`` must be off,
  and ``use_async_staging`` is tried as well — the fastest of the options that run is reported
- ``torch.save``: blocking ``torch.save`` of the same state dict

For each checkpoint: **stall** (the save call, plus any wait for staging before the next
optimizer step), **background** (from the call until the files are complete), and **drain
slowdown** (the extra time of the training steps run while the write goes on, against the median
step before). ``overhead@5min`` = (stall + drain slowdown) / 300 s. The first checkpoint of a
method (allocation, process start, plan) is reported apart from the steady state (median of the
others).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Trainer:
    def __init__(self, hidden: int, layers: int, batch: int):
        torch.manual_seed(0)
        self.model = nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)])
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, hidden)
        self.before_optimizer = None  # a wait the checkpoint method needs before weights change

    def step(self) -> float:
        t0 = time.perf_counter()
        self.optim.zero_grad(set_to_none=False)
        self.model(self.x).pow(2).mean().backward()
        blocked = 0.0
        if self.before_optimizer is not None:
            t1 = time.perf_counter()
            self.before_optimizer()
            self.before_optimizer = None
            blocked = time.perf_counter() - t1
        self.optim.step()
        return time.perf_counter() - t0, blocked

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optim": self.optim.state_dict()}

    def state_bytes(self) -> int:
        total = 0
        for part in (self.model.state_dict(), self.optim.state_dict()["state"]):
            for v in part.values():
                for t in v.values() if isinstance(v, dict) else [v]:
                    if isinstance(t, torch.Tensor):
                        total += t.nbytes
        return total


class Lockstep:
    def __init__(self, name: str, overlap: bool):
        from lockstep.checkpoint import Checkpointer

        self.name, self.overlap = name, overlap
        self.ck = Checkpointer()
        self.last = None

    def save(self, trainer, path):
        self.last = self.ck.save(trainer.state(), path, overlap=self.overlap)
        return self.last

    def blocked_in_step(self) -> float:
        """Time optimizer steps waited for overlapped staging (the global pre-step hook)."""
        return self.last.capture.blocked_s if self.last is not None else 0.0

    @staticmethod
    def done(handle) -> bool:
        return handle.done()

    @staticmethod
    def finish(handle) -> None:
        handle.wait()

    def close(self):
        self.ck.close()


class DcpAsync:
    def __init__(self, name: str, kind: str, stager_options=None):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.name = name
        self.kind = AsyncCheckpointerType.PROCESS if kind == "process" else AsyncCheckpointerType.THREAD
        self.stager = DefaultStager(StagingOptions(**stager_options)) if stager_options is not None else None
        self.async_staging = bool(stager_options and stager_options.get("use_async_staging"))

    def save(self, trainer, path):
        kwargs = {"checkpoint_id": path, "async_checkpointer_type": self.kind}
        if self.stager is not None:
            kwargs["async_stager"] = self.stager
        response = dcp.async_save(trainer.state(), **kwargs)
        if hasattr(response, "staging_completion"):
            # TorchTitan's pattern: the next optimizer step waits for staging to finish.
            trainer.before_optimizer = response.staging_completion.result
            return response.upload_completion
        return response

    @staticmethod
    def done(future) -> bool:
        return future.done()

    @staticmethod
    def finish(future) -> None:
        future.result()

    def close(self):
        if self.stager is not None:
            self.stager.close()


class TorchSave:
    name = "torch.save"

    def save(self, trainer, path):
        os.makedirs(path, exist_ok=True)
        torch.save(trainer.state(), os.path.join(path, "state.pt"))
        return None

    @staticmethod
    def done(_) -> bool:
        return True

    @staticmethod
    def finish(_) -> None:
        pass

    def close(self):
        pass


def run_method(method, trainer: Trainer, root: str, checkpoints: int, baseline_steps: int) -> dict:
    for _ in range(2):
        trainer.step()
    base = statistics.median(trainer.step()[0] for _ in range(baseline_steps))
    rows = []
    previous = None
    for i in range(checkpoints):
        path = os.path.join(root, f"{method.name}-{i}")
        t0 = time.perf_counter()
        handle = method.save(trainer, path)
        call = time.perf_counter() - t0
        hook_before = getattr(method, "blocked_in_step", lambda: 0.0)()
        extra_blocked = 0.0
        drain_steps = []
        while not method.done(handle):
            dt, blocked = trainer.step()
            extra_blocked += blocked
            drain_steps.append(dt - blocked)
        method.finish(handle)
        background = time.perf_counter() - t0
        if trainer.before_optimizer is not None:  # staging still owed: the next step pays it
            dt, blocked = trainer.step()
            extra_blocked += blocked
        hook = getattr(method, "blocked_in_step", lambda: 0.0)() - hook_before
        extra_blocked += hook
        if hook and drain_steps:
            drain_steps[0] -= hook  # the wait was inside the first step: stall, not slowdown
        stall = call + extra_blocked
        slowdown = sum(max(0.0, s - base) for s in drain_steps)
        rows.append(
            {"stall_s": stall, "background_s": background, "drain_steps": len(drain_steps), "drain_slowdown_s": slowdown}
        )
        print(f"  {method.name:20s} #{i}: stall {stall:7.3f} s  background {background:6.2f} s  "
              f"{len(drain_steps):3d} steps while draining, +{slowdown:6.3f} s", flush=True)
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        previous = path
        for _ in range(2):
            trainer.step()
    shutil.rmtree(previous, ignore_errors=True)
    steady = rows[1:] or rows
    stall = statistics.median(r["stall_s"] for r in steady)
    slowdown = statistics.median(r["drain_slowdown_s"] for r in steady)
    return {
        "method": method.name,
        "baseline_step_s": base,
        "first": rows[0],
        "stall_s": stall,
        "background_s": statistics.median(r["background_s"] for r in steady),
        "drain_slowdown_s": slowdown,
        "overhead_at_5min": (stall + slowdown) / 300.0,
        "rows": rows,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary directory under /tmp)")
    parser.add_argument("--checkpoints", type=int, default=4, help="checkpoints per method (the first is reported apart)")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training loop (torchrun's default is 1)")
    parser.add_argument("--baseline-steps", type=int, default=8)
    parser.add_argument(
        "--methods", default="lockstep,lockstep-overlap,dcp-thread,dcp-process,dcp-process-stager,dcp-process-async-stager,torch.save"
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    # dcp.async_save's PROCESS mode needs a process group; one gloo rank, as in the machine notes.
    dist.init_process_group("gloo", rank=0, world_size=1)
    root = args.dir or tempfile.mkdtemp(prefix="lockstep-bench-ckpt-")
    os.makedirs(root, exist_ok=True)
    trainer = Trainer(args.hidden, args.layers, args.batch)
    trainer.step()
    nbytes = trainer.state_bytes()
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "load_before": load_average(),
        "state_bytes": nbytes,
        "dir": root,
        "threads": args.threads,
    }
    print(f"{nbytes / 1e6:.0f} MB of state, checkpoints to {root}, load {header['load_before']}", flush=True)
    makers = {
        "lockstep": lambda: Lockstep("lockstep", overlap=False),
        "lockstep-overlap": lambda: Lockstep("lockstep-overlap", overlap=True),
        "dcp-thread": lambda: DcpAsync("dcp-thread", "thread"),
        "dcp-process": lambda: DcpAsync("dcp-process", "process"),
        "dcp-process-stager": lambda: DcpAsync(
            "dcp-process-stager",
            "process",
            {"use_pinned_memory": False, "use_shared_memory": True, "use_async_staging": False, "use_non_blocking_copy": False},
        ),
        "dcp-process-async-stager": lambda: DcpAsync(
            "dcp-process-async-stager",
            "process",
            {"use_pinned_memory": False, "use_shared_memory": True, "use_async_staging": True, "use_non_blocking_copy": False},
        ),
        "torch.save": TorchSave,
    }
    results, failures = [], {}
    for name in args.methods.split(","):
        method = None
        try:
            method = makers[name]()
            results.append(run_method(method, trainer, root, args.checkpoints, args.baseline_steps))
        except Exception as exc:  # an option DCP refuses on this machine: say so, go on
            failures[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            print(f"  {name}: does not run here: {failures[name]}", flush=True)
        finally:
            if method is not None:
                method.close()
            gc.collect()
    header["load_after"] = load_average()
    print()
    print("| method | first stall s | stall s | background s | drain slowdown s | overhead @ 5 min |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['method']} | {r['first']['stall_s']:.3f} | {r['stall_s']:.3f} | {r['background_s']:.2f} | "
              f"{r['drain_slowdown_s']:.3f} | {100 * r['overhead_at_5min']:.3f} % |")
    for name, why in failures.items():
        print(f"| {name} | does not run: {why} | | | | |")
    dcp_best = min((r["stall_s"] for r in results if r["method"].startswith("dcp")), default=None)
    for ours in (r for r in results if r["method"].startswith("lockstep")):
        if dcp_best:
            print(f"{ours['method']} stall / fastest dcp.async_save stall = {ours['stall_s'] / dcp_best:.3f} (goal <= 0.333)")
    print(f"load before {header['load_before']}, after {header['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "results": results, "failures": failures}, f, indent=1)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
