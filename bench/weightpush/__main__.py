"""Weight push: a >= 1 GB model to 1, 2 and 4 rollout replicas (separate processes), in one run.

    python -m bench.weightpush                          # 1 GiB, TCP, 1/2/4 replicas, 4 streams
    python -m bench.weightpush --transport gloo --size-mb 1024 --replicas 1,2,4
    python -m bench.weightpush --size-mb 256            # a smaller model for a busy machine

For each replica count, three ways to move the same bytes over the same transport:

- **wire**: a plain bulk copy, the model's bytes as one contiguous buffer sent to every replica
  at once (one stream each), into a preallocated buffer: the transport's floor.
- **lockstep**: ``WeightPublisher.push`` of a full new version (no delta), from the call until
  every replica has acknowledged it whole; replicas keep running rollout steps meanwhile and
  report how long a step was ever blocked (``max_blocked``) against their longest swap.
  ``--copy pull`` (the default): ``push(overlap=True)``, the leader reads the weights out of the
  trainer (``process_vm_readv``) while sending; ``--copy trainer``: the trainer copies them into
  the arena itself before ``push`` returns (pipelined with the sends).
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def model_weights(size_mb: int) -> dict[str, torch.Tensor]:
    """Layers of 4096 x 1024 fp32 (16 MiB) plus a bias each, ``size_mb`` MiB in all."""
    g = torch.Generator().manual_seed(0)
    layers = max(1, size_mb // 16)
    out = {}
    for i in range(layers):
        out[f"layers.{i}.weight"] = torch.randn(4096, 1024, generator=g)
        out[f"layers.{i}.bias"] = torch.randn(4096, generator=g)
    return out


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
    procs = [spawn("wire", args, links.port, name, ["--nbytes", str(flat.numel()), "--rounds", str(args.rounds)]) for name in names]
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


def run_lockstep(args, weights, n) -> dict:
    from lockstep.weights import WeightPublisher

    pub = WeightPublisher(weights, streams=args.streams, transport=args.transport, delta=False)
    last = 1 + args.rounds
    procs = [spawn("lockstep", args, pub.address[1], f"rollout{i}", ["--until", str(last)]) for i in range(n)]
    try:
        pub.push(weights).wait(timeout=900)
        for p in procs:
            ready(p)
        while sum(1 for s in pub.status()["replicas"].values() if s["applied"] == 1) < n:
            time.sleep(0.05)  # benchmark warm-up: every replica connected and running version 1
        time.sleep(1.0)  # a quiet second of rollout steps: the blocked-time baseline
        times, stalls, helds, windows = [], [], [], []
        for _ in range(args.rounds):
            with torch.no_grad():
                for t in weights.values():
                    t.add_(1.0)
            w0 = time.time()
            t0 = time.perf_counter()
            handle = pub.push(weights, overlap=args.copy == "pull")
            stalls.append(handle.stall_s)
            handle.wait_staged(timeout=900)
            helds.append(time.perf_counter() - t0)  # until here an optimizer step would wait
            assert handle.pulled == (args.copy == "pull"), "the leader could not read this process"
            result = handle.wait(timeout=900)
            times.append(time.perf_counter() - t0)
            windows.append((w0, time.time() + 0.5))  # the swap follows delivery within a step
            assert set(result["replicas"].values()) == {"received"} and len(result["replicas"]) == n, result
        reports = [finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        pub.close()
    during = [b for r in reports for at, b in r["samples"] if any(a <= at <= z for a, z in windows)]
    quiet = [b for r in reports for at, b in r["samples"] if at < windows[0][0]]
    return {
        "push_s": min(times),
        "stall_s": min(stalls),  # best of the rounds, like push_s
        "held_s": min(helds),
        "max_blocked_s": max(during, default=0.0),
        "quiet_max_blocked_s": max(quiet, default=0.0),
        "max_swap_s": max(r["max_swap_s"] for r in reports),
        "max_lock_wait_s": max(r["max_lock_wait_s"] for r in reports),
        "rollout_steps": sum(len(r["samples"]) for r in reports),
        "errors": [e for r in reports for e in r["errors"]],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--transport", choices=["tcp", "gloo"], default="tcp")
    parser.add_argument("--streams", type=int, default=4, help="lockstep links per replica (senders)")
    parser.add_argument("--rounds", type=int, default=2, help="timed transfers per method (the best is reported)")
    parser.add_argument("--methods", default="wire,lockstep,naive")
    parser.add_argument("--copy", choices=["pull", "trainer"], default="pull",
                        help="who stages the weights: the leader reads the trainer's memory, or the trainer copies")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    weights = model_weights(args.size_mb)
    nbytes = sum(t.nbytes for t in weights.values())
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "load_before": load_average(),
        "bytes": nbytes,
        "tensors": len(weights),
        "transport": args.transport,
        "streams": args.streams,
        "copy": args.copy,
    }
    print(f"{nbytes / 2**20:.0f} MiB in {len(weights)} tensors over {args.transport}, copy: {args.copy}, load {header['load_before']}", flush=True)
    rows = []
    methods = args.methods.split(",")
    for n in (int(x) for x in args.replicas.split(",")):
        row = {"replicas": n}
        if "wire" in methods:
            row["wire_s"] = run_wire(args, weights, n)
            print(f"  {n} replica(s): wire {row['wire_s']:.2f} s", flush=True)
        if "lockstep" in methods:
            row.update(run_lockstep(args, weights, n))
            print(f"  {n} replica(s): lockstep {row['push_s']:.2f} s (stall {row['stall_s'] * 1e3:.0f} ms, weights held {row['held_s'] * 1e3:.0f} ms, rollout step "
                  f"blocked at most {row['max_blocked_s'] * 1e3:.2f} ms during pushes, {row['quiet_max_blocked_s'] * 1e3:.2f} ms "
                  f"when quiet, longest swap {row['max_swap_s'] * 1e3:.2f} ms, longest lock wait {row['max_lock_wait_s'] * 1e3:.2f} ms)",
                  flush=True)
        if "naive" in methods:
            row["naive_s"] = run_naive(args, weights, n)
            print(f"  {n} replica(s): naive {row['naive_s']:.2f} s", flush=True)
        rows.append(row)
    header["load_after"] = load_average()
    print()
    print("| replicas | wire s | lockstep s | lockstep / wire | naive s | push() stall ms | weights held ms | rollout blocked max ms (during / quiet) | longest swap ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        ratio = r["push_s"] / r["wire_s"] if "push_s" in r and "wire_s" in r else float("nan")
        print(f"| {r['replicas']} | {r.get('wire_s', float('nan')):.2f} | {r.get('push_s', float('nan')):.2f} | {ratio:.2f} | "
              f"{r.get('naive_s', float('nan')):.2f} | {1e3 * r.get('stall_s', float('nan')):.0f} | {1e3 * r.get('held_s', float('nan')):.0f} | "
              f"{1e3 * r.get('max_blocked_s', float('nan')):.2f} / {1e3 * r.get('quiet_max_blocked_s', float('nan')):.2f} | "
              f"{1e3 * r.get('max_swap_s', float('nan')):.2f} |")
    print(f"load before {header['load_before']}, after {header['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
