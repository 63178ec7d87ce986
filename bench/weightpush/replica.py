"""One rollout replica of bench.weightpush (a separate process): lockstep, wire or naive receiver."""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from datetime import timedelta

import torch


class StepClock:
    """Where a rollout step's wall time went, on this thread: its own CPU, waiting for a core, asleep.

    Asleep (wall - CPU - runqueue wait) is the time the thread waited on something: the
    replica's lock, the GIL, a page (a step does no I/O). Runqueue wait (``run_delay`` in
    ``/proc/thread-self/schedstat``) is CPU contention: the thread was ready and had no core.
    The thread's voluntary context switches and page faults (``getrusage``) say which; with no
    voluntary switch the thread waited on nothing (the rest is the vCPU's steal time).
    """

    def __init__(self):
        self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)  # this thread's

    def read(self) -> tuple[float, float, float, int, int]:
        run_delay = int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        use = resource.getrusage(resource.RUSAGE_THREAD)
        return time.perf_counter(), time.thread_time(), run_delay, use.ru_nvcsw, use.ru_minflt + use.ru_majflt


def rollout_step(tensors) -> float:
    """A stand-in for a generation: reads a little of every tensor of the version it holds."""
    return sum(float(t.reshape(-1)[:64].sum()) for t in tensors)


def lockstep(args) -> dict:
    from lockstep.weights import WeightReplica

    replica = WeightReplica((args.host, args.port), name=args.name)
    replica.wait_for_version(1, timeout=600)
    print(json.dumps({"ready": True}), flush=True)
    clock = StepClock()
    # per step: wall clock at entry, then seconds: entering hold(), the step, its CPU, runqueue wait,
    # lock wait, swap; then counts: voluntary context switches, page faults
    samples = []
    while True:
        at = time.time()
        t0, c0, q0, v0, f0 = clock.read()
        with replica.hold() as w:
            entered = time.perf_counter() - t0
            rollout_step(w.tensors.values())
        t1, c1, q1, v1, f1 = clock.read()
        samples.append((at, entered, t1 - t0, c1 - c0, q1 - q0, w.lock_wait_s, w.swap_s, v1 - v0, f1 - f0))
        if w.version >= args.until:
            break
        time.sleep(0.002)  # a rollout step every few ms, between them the replica is idle
    out = {"samples": samples, "max_swap_s": replica.max_swap_s, "max_lock_wait_s": replica.max_lock_wait_s, "swaps": replica.swaps,
           "version": replica.version, "errors": replica.errors}
    replica.close()
    return out


def _link(args):
    if args.transport == "tcp":
        sock = socket.create_connection((args.host, args.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    import torch.distributed as dist

    store = dist.TCPStore(args.host, args.port, is_master=False)
    return dist.ProcessGroupGloo(dist.PrefixStore(f"bench/{args.name}", store), 1, 2, timedelta(seconds=600))


def _recv_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("closed")
        got += n


def wire(args) -> dict:
    buf = torch.empty(args.nbytes, dtype=torch.uint8)
    link = _link(args)
    # The same rollout steps as a lockstep replica runs, on the same number of tensors: both
    # phases leave the transfer the same share of the cores.
    views = list(buf.chunk(args.tensors))
    stop = threading.Event()

    def rollout() -> None:
        while not stop.is_set():
            rollout_step(views)
            time.sleep(0.002)

    steps = threading.Thread(target=rollout, daemon=True)
    steps.start()
    print(json.dumps({"ready": True}), flush=True)
    for _ in range(args.rounds):
        if args.transport == "tcp":
            _recv_exact(link, memoryview(buf.numpy()))
            link.sendall(b"k")
        else:
            link.recv([buf], 0, 1).wait()
            link.send([torch.ones(1, dtype=torch.uint8)], 0, 2).wait()
    stop.set()
    steps.join()
    return {"received": args.nbytes}


def naive(args) -> dict:
    link = _link(args)
    shapes = json.loads(sys.stdin.readline())
    print(json.dumps({"ready": True}), flush=True)
    tensors = [torch.empty(s, dtype=torch.float32) for s in shapes]
    for _ in range(args.rounds):
        for t in tensors:
            if args.transport == "tcp":
                (n,) = struct.unpack("!Q", _recv_exact_bytes(link, 8))
                t.copy_(torch.load(io.BytesIO(_recv_exact_bytes(link, n)), weights_only=True))
            else:
                link.recv([t], 0, 3).wait()
        if args.transport == "tcp":
            link.sendall(b"k")
        else:
            link.send([torch.ones(1, dtype=torch.uint8)], 0, 2).wait()
    return {"tensors": len(tensors)}


def _recv_exact_bytes(sock, n):
    buf = bytearray(n)
    _recv_exact(sock, memoryview(buf))
    return bytes(buf)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["lockstep", "wire", "naive"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--transport", default="tcp")
    p.add_argument("--nbytes", type=int, default=0)
    p.add_argument("--tensors", type=int, default=1)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--until", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    result = {"lockstep": lockstep, "wire": wire, "naive": naive}[args.mode](args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
