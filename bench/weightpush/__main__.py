"""Weight push: a >= 1 GB model to 1, 2 and 4 rollout replicas (separate processes), in one run.

    python -m bench.weightpush                          # 1 GiB, TCP, 1/2/4 replicas, 4 streams
    python -m bench.weightpush --transport gloo --size-mb 1024 --replicas 1,2,4
    python -m bench.weightpush --size-mb 256            # a smaller model for a busy machine
    python -m bench.weightpush --transport gloo --copy shared,pull --repeats 3 --methods wire,lockstep

For each replica count, three ways to move the same bytes over the same transport, measured
interleaved: ``--repeats`` times in turn the wire, then lockstep with each ``--copy`` mode (each
phase ``--rounds`` transfers, the best kept); the ratio to the wire is taken per repeat against
the wire phase just before it, and the table gives the median and the range of those ratios.

- **wire**: a plain bulk copy, the model's bytes as one contiguous buffer sent to every replica
  at once (one stream each), into a preallocated buffer: the transport's floor.
- **lockstep**: ``WeightPublisher.push`` of a full new version (no delta), from the call until
  every replica has acknowledged it whole; replicas keep running rollout steps meanwhile, and
  each step's wall time is split (``replica.StepClock``) into its own CPU, waiting for a core
  (runqueue: CPU contention) and asleep (on the replica's lock or the GIL). A step's time
  *blocked on the push* is asleep + the swap it did; the table gives its max and p99 during
  pushes against the longest swap. The wire's replicas run the same rollout steps.
  ``--copy shared`` (the default): ``WeightPublisher(model, share=True)`` and ``push(overlap=True)``:
  the model's tensors live in memory shared with the leader, which sends straight from them (no
  copy before the send; the arena copy for late joiners follows delivery); ``--copy pull``:
  ``push(overlap=True)``, the leader reads the weights out of the trainer (``process_vm_readv``)
  while sending; ``--copy trainer``: the trainer copies them into the arena itself before
  ``push`` returns (pipelined with the sends). The push time is from the call to the leader's
  word that every replica has the whole version (``PushHandle.delivered_s``).
- **naive**: per tensor, ``torch.save`` to bytes and a length-prefixed send (TCP) or one send
  per tensor (gloo), one replica after another, as per-parameter RPC code does.

Memory: the model and the publisher's arena on this side, two buffers per tensor on each
replica (1 GiB model, 4 replicas: about 10 GiB in all).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def make_model(size_mb: int) -> nn.Module:
    """Layers of 4096 x 1024 fp32 (16 MiB) plus a bias each, ``size_mb`` MiB in all."""
    g = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        model = nn.Sequential(*[nn.Linear(1024, 4096) for _ in range(max(1, size_mb // 16))])
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model


def spawn(mode: str, args, port: int, name: str, extra: list[str] = (), stdin_line: str | None = None):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.weightpush.replica", mode, "--port", str(port), "--name", name,
         "--transport", args.transport, *extra],
        env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    if stdin_line is not None:
        proc.stdin.write(stdin_line + "\n")
        proc.stdin.flush()
    return proc


def ready(proc) -> None:
    line = proc.stdout.readline()
    if not line or not json.loads(line).get("ready"):
        raise RuntimeError(f"replica did not start ({proc.poll()})")


def finish(proc) -> dict:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"replica failed ({proc.returncode}): {out}")
    return json.loads(out.strip().splitlines()[-1])


class Links:
    """The bench's side of N plain links (TCP sockets or 2-rank gloo groups)."""

    def __init__(self, transport: str, n: int, names: list[str]):
        self.transport = transport
        if transport == "tcp":
            self.server = socket.create_server(("127.0.0.1", 0))
            self.port = self.server.getsockname()[1]
        else:
            import torch.distributed as dist

            self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            self.port = self.store.port
        self.names = names
        self.links = []

    def accept(self) -> None:
        if self.transport == "tcp":
            for _ in self.names:
                sock, _ = self.server.accept()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.links.append(sock)
        else:
            import torch.distributed as dist

            for name in self.names:
                self.links.append(dist.ProcessGroupGloo(dist.PrefixStore(f"bench/{name}", self.store), 0, 2, timedelta(seconds=600)))

    def ack(self, link) -> None:
        if self.transport == "tcp":
            assert link.recv(1) == b"k"
        else:
            link.recv([torch.zeros(1, dtype=torch.uint8)], 1, 2).wait()


def parallel(fns) -> None:
    threads = [threading.Thread(target=f) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_wire(args, weights, n) -> float:
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in weights.values()])
    names = [f"wire{i}" for i in range(n)]
    links = Links(args.transport, n, names)
    extra = ["--nbytes", str(flat.numel()), "--tensors", str(len(weights)), "--rounds", str(args.rounds)]
    procs = [spawn("wire", args, links.port, name, extra) for name in names]
    links.accept()
    for p in procs:
        ready(p)
    times = []
    for _ in range(args.rounds):
        def send(link):
            if args.transport == "tcp":
                link.sendall(memoryview(flat.numpy()))
            else:
                link.send([flat], 1, 1).wait()
            links.ack(link)

        t0 = time.perf_counter()
        parallel([lambda lk=lk: send(lk) for lk in links.links])
        times.append(time.perf_counter() - t0)
    for p in procs:
        finish(p)
    return min(times)


def run_naive(args, weights, n) -> float:
    names = [f"naive{i}" for i in range(n)]
    links = Links(args.transport, n, names)
    shapes = json.dumps([list(t.shape) for t in weights.values()])
    procs = [spawn("naive", args, links.port, name, ["--rounds", str(args.rounds)], stdin_line=shapes) for name in names]
    links.accept()
    for p in procs:
        ready(p)
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for link in links.links:  # one replica after another, one tensor at a time
            for t in weights.values():
                if args.transport == "tcp":
                    buf = io.BytesIO()
                    torch.save(t, buf)
                    data = buf.getvalue()
                    link.sendall(struct.pack("!Q", len(data)) + data)
                else:
                    link.send([t], 1, 3).wait()
            links.ack(link)
        times.append(time.perf_counter() - t0)
    for p in procs:
        finish(p)
    return min(times)


def run_lockstep(args, model, n, copy) -> dict:
    from lockstep.weights import WeightPublisher

    pub = WeightPublisher(model, streams=args.streams, transport=args.transport, delta=False, share=copy == "shared")
    last = 1 + args.rounds
    procs = [spawn("lockstep", args, pub.address[1], f"rollout{i}", ["--until", str(last)]) for i in range(n)]
    try:
        pub.push(model).wait(timeout=900)
        for p in procs:
            ready(p)
        while sum(1 for s in pub.status()["replicas"].values() if s["applied"] == 1) < n:
            time.sleep(0.05)  # benchmark warm-up: every replica connected and running version 1
        time.sleep(1.0)  # a quiet second of rollout steps: the blocked-time baseline
        times, stalls, helds, windows = [], [], [], []
        for _ in range(args.rounds):
            with torch.no_grad():
                for t in model.parameters():
                    t.add_(1.0)
            w0 = time.time()
            t0 = time.perf_counter()
            handle = pub.push(model, overlap=copy != "trainer")
            stalls.append(handle.stall_s)
            handle.wait_staged(timeout=900)
            helds.append(time.perf_counter() - t0)  # until here an optimizer step would wait
            assert handle.pulled == (copy != "trainer"), "the leader could not read this process"
            result = handle.wait(timeout=900)
            times.append(handle.delivered_s)
            windows.append((w0, time.time() + 0.5))  # the swap follows delivery within a step
            assert set(result["replicas"].values()) == {"received"} and len(result["replicas"]) == n, result
        reports = [finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        pub.close()
    def steps(inside: bool) -> list[tuple]:
        return [st for r in reports for st in r["samples"] if any(a <= st[0] <= z for a, z in windows) == inside and (inside or st[0] < windows[0][0])]

    during, quiet = steps(True), steps(False)
    busy, calm = blocked_stats(during), blocked_stats(quiet)
    longest_swap = max(r["max_swap_s"] for r in reports)
    return {
        "over_swap": sum(1 for st in during if blocked_s(st) > longest_swap),  # the goal: none
        "push_s": min(times),
        "stall_s": min(stalls),  # best of the rounds, like push_s
        "held_s": min(helds),
        **{f"{key}_s": v for key, v in busy.items()},
        **{f"quiet_{key}_s": v for key, v in calm.items()},
        "max_swap_s": longest_swap,
        "max_lock_wait_s": max(r["max_lock_wait_s"] for r in reports),
        "rollout_steps": len(during) + len(quiet),
        "errors": [e for r in reports for e in r["errors"]],
    }


def blocked_s(step: tuple) -> float:
    """A rollout step's time blocked on the push (see replica.StepClock): asleep + its swap.

    Off its CPU and not in the runqueue counts as asleep only if the thread did go to sleep (a
    voluntary context switch): without one it never waited on anything, and the gap is time the
    VM's vCPU itself was not running (steal), which neither clock sees — contention, like the runqueue.
    """
    _, _, wall, cpu, runq, _, swap, sleeps, _ = step
    return (max(0.0, wall - cpu - runq) if sleeps else 0.0) + swap


def blocked_stats(samples: list[tuple]) -> dict:
    blocked = sorted(blocked_s(st) for st in samples) or [0.0]
    return {
        "blocked_max": blocked[-1],
        "blocked_p99": blocked[min(len(blocked) - 1, int(0.99 * len(blocked)))],
        "runq_max": max((s[4] for s in samples), default=0.0),
        "entered_max": max((s[1] for s in samples), default=0.0),
        "step_max": max((s[2] for s in samples), default=0.0),
        # the most blocked step: how often it slept, how many page faults it took
        "worst_sleeps_faults": max(samples, key=blocked_s)[7:9] if samples else (0, 0),
    }


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--transport", choices=["tcp", "gloo"], default="tcp")
    parser.add_argument("--streams", type=int, default=4, help="lockstep links per replica (senders)")
    parser.add_argument("--rounds", type=int, default=2, help="timed transfers per phase (the best is kept)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved wire / lockstep phases per replica count")
    parser.add_argument("--methods", default="wire,lockstep,naive")
    parser.add_argument("--copy", default="shared",
                        help="comma-separated: shared (the leader sends from the trainer's shared weights), pull (it reads "
                             "the trainer's memory first), trainer (the trainer copies into the arena)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    copies = args.copy.split(",")
    if not set(copies) <= {"shared", "pull", "trainer"}:
        parser.error(f"--copy: shared, pull or trainer, not {args.copy!r}")
    torch.set_num_threads(1)
    model = make_model(args.size_mb)
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    nbytes = sum(t.nbytes for t in weights.values())
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "load_before": load_average(),
        "bytes": nbytes,
        "tensors": len(weights),
        "transport": args.transport,
        "streams": args.streams,
        "copy": copies,
        "repeats": args.repeats,
    }
    print(f"{nbytes / 2**20:.0f} MiB in {len(weights)} tensors over {args.transport}, copy: {args.copy}, load {header['load_before']}", flush=True)
    rows = []
    methods = args.methods.split(",")
    for n in (int(x) for x in args.replicas.split(",")):
        wires, pushes, loads = [], {c: [] for c in copies}, []
        for k in range(args.repeats):
            loads.append(load_average().split()[0])
            wire_s = None
            if "wire" in methods:
                wire_s = run_wire(args, weights, n)
                wires.append(wire_s)
                print(f"  {n} replica(s), repeat {k + 1}: wire {wire_s:.2f} s (load {loads[-1]})", flush=True)
            if "lockstep" in methods:
                for copy in copies:
                    r = run_lockstep(args, model, n, copy)
                    r["ratio"] = r["push_s"] / wire_s if wire_s else float("nan")
                    pushes[copy].append(r)
                    print(f"  {n} replica(s), repeat {k + 1}: lockstep/{copy} {r['push_s']:.2f} s = {r['ratio']:.2f} x wire (stall {r['stall_s'] * 1e3:.0f} ms, "
                          f"weights held {r['held_s'] * 1e3:.0f} ms; rollout steps during pushes: blocked max {r['blocked_max_s'] * 1e3:.2f} ms, "
                          f"p99 {r['blocked_p99_s'] * 1e3:.2f} ms (quiet max {r['quiet_blocked_max_s'] * 1e3:.2f}), longest swap {r['max_swap_s'] * 1e3:.2f} ms, "
                          f"runqueue wait max {r['runq_max_s'] * 1e3:.2f} ms (quiet {r['quiet_runq_max_s'] * 1e3:.2f}), "
                          f"wall to enter hold() max {r['entered_max_s'] * 1e3:.2f} ms (quiet {r['quiet_entered_max_s'] * 1e3:.2f}), "
                          f"longest lock wait {r['max_lock_wait_s'] * 1e3:.3f} ms, steps {r['rollout_steps']}, "
                          f"blocked longer than the longest swap: {r['over_swap']}, the most blocked one slept/faulted "
                          f"{r['worst_sleeps_faults_s'][0]}/{r['worst_sleeps_faults_s'][1]} times)", flush=True)
        naive_s = None
        if "naive" in methods:
            naive_s = run_naive(args, weights, n)
            print(f"  {n} replica(s): naive {naive_s:.2f} s", flush=True)
        for copy in copies if "lockstep" in methods else [None]:
            row = {"replicas": n, "copy": copy, "wire_s": wires, "naive_s": naive_s, "loads": loads}
            if copy is not None:
                rs = pushes[copy]
                row.update({
                    "push_s": [r["push_s"] for r in rs], "ratios": [r["ratio"] for r in rs],
                    "stall_s": min(r["stall_s"] for r in rs), "held_s": median([r["held_s"] for r in rs]),
                    **{key: max(r[key] for r in rs) for key in ("blocked_max_s", "blocked_p99_s", "quiet_blocked_max_s", "runq_max_s",
                                                                 "quiet_runq_max_s", "entered_max_s", "quiet_entered_max_s")},
                    "max_swap_s": max(r["max_swap_s"] for r in rs), "max_lock_wait_s": max(r["max_lock_wait_s"] for r in rs),
                    "over_swap": sum(r["over_swap"] for r in rs), "errors": [e for r in rs for e in r["errors"]],
                })
            rows.append(row)
    header["load_after"] = load_average()
    nan = float("nan")
    print()
    print("| replicas | copy | wire s (median) | lockstep s (median) | lockstep / wire: median (range) | naive s | push() stall ms | weights held ms "
          "| step blocked on the push ms: max / p99 (quiet max) | longest swap ms | steps blocked > longest swap "
          "| runqueue wait max ms (during / quiet) | load |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        ratios = r.get("ratios") or [nan]
        print(f"| {r['replicas']} | {r['copy']} | {median(r['wire_s']) if r['wire_s'] else nan:.2f} | {median(r['push_s']) if r.get('push_s') else nan:.2f} | "
              f"**{median(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f}) | {r['naive_s'] if r['naive_s'] is not None else nan:.2f} | "
              f"{1e3 * r.get('stall_s', nan):.0f} | {1e3 * r.get('held_s', nan):.0f} | "
              f"{1e3 * r.get('blocked_max_s', nan):.2f} / {1e3 * r.get('blocked_p99_s', nan):.2f} ({1e3 * r.get('quiet_blocked_max_s', nan):.2f}) | "
              f"{1e3 * r.get('max_swap_s', nan):.2f} | {r.get('over_swap', nan)} | {1e3 * r.get('runq_max_s', nan):.1f} / {1e3 * r.get('quiet_runq_max_s', nan):.1f} | {'–'.join(sorted(r['loads'], key=float)[::max(1, len(r['loads']) - 1)])} |")
    print(f"load before {header['load_before']}, after {header['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
