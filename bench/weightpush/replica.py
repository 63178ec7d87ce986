"""One rollout replica of bench.weightpush (a separate process): lockstep, wire or naive receiver."""

from __future__ import annotations

import argparse
import io
import json
import socket
import struct
import sys
import time
from datetime import timedelta

import torch


def lockstep(args) -> dict:
    from lockstep.weights import WeightReplica

    replica = WeightReplica((args.host, args.port), name=args.name)
    replica.wait_for_version(1, timeout=600)
    print(json.dumps({"ready": True}), flush=True)
    samples = []  # (wall clock at entry, seconds blocked entering hold())
    while True:
        at = time.time()
        entered = time.perf_counter()
        with replica.hold() as w:
            blocked = time.perf_counter() - entered
            # a "rollout step": reads a little of every tensor of the version it holds
            _ = sum(float(t.reshape(-1)[:64].sum()) for t in w.tensors.values())
        samples.append((at, blocked))
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
    print(json.dumps({"ready": True}), flush=True)
    for _ in range(args.rounds):
        if args.transport == "tcp":
            _recv_exact(link, memoryview(buf.numpy()))
            link.sendall(b"k")
        else:
            link.recv([buf], 0, 1).wait()
            link.send([torch.ones(1, dtype=torch.uint8)], 0, 2).wait()
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
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--until", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    result = {"lockstep": lockstep, "wire": wire, "naive": naive}[args.mode](args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
