"""Small traffic tools to run inside namespaces (`Fabric.exec` / `Fabric.spawn`); JSON on stdout.

    python -m testbed.probe serve --port 7000            UDP echo responder (prints "ready")
    python -m testbed.probe send --src A --dst B --port 7000 --count 200 --flows 50 [--echo]
    python -m testbed.probe sink --port 7001             count UDP datagrams until quiet
    python -m testbed.probe tcp-sink --port 7002         receive one TCP stream, report Mbit/s
    python -m testbed.probe tcp-send --src A --dst B --port 7002 --seconds 2

`send` spreads its datagrams over `--flows` sockets, each with its own source port, so ECMP
hashing (layer 4) spreads them over the fabric's paths.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import struct
import sys
import time

HEADER = struct.Struct("!IIq")  # seq, flow, send time (ns)


def _ready() -> None:
    print("ready", flush=True)


def serve(args: argparse.Namespace) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    sock.bind((args.bind, args.port))
    _ready()
    while True:
        data, peer = sock.recvfrom(65535)
        sock.sendto(data, peer)


def sink(args: argparse.Namespace) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    sock.bind((args.bind, args.port))
    _ready()
    count = 0
    first = None
    deadline = time.monotonic() + args.max_time
    while time.monotonic() < deadline:
        sock.settimeout(args.quiet if first is not None else max(0.01, deadline - time.monotonic()))
        try:
            sock.recvfrom(65535)
        except TimeoutError:
            if first is not None:
                break
            continue
        count += 1
        first = first or time.monotonic()
    print(json.dumps({"received": count}), flush=True)
    return 0


def send(args: argparse.Namespace) -> int:
    results = [_send_one(args, dst) for dst in args.dst]
    print(json.dumps(results[0] if len(results) == 1 else {"results": results}), flush=True)
    return 0


def _send_one(args: argparse.Namespace, dst: str) -> dict:
    socks = []
    for i in range(args.flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        s.bind((args.src, args.sport_base + i if args.sport_base else 0))
        s.setblocking(False)
        socks.append(s)
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        sel.register(s, selectors.EVENT_READ, i)
    sent = [0] * args.flows
    recv = [0] * args.flows
    rtts: list[float] = []
    seen: set[int] = set()
    pad = b"\0" * max(0, args.size - HEADER.size)

    def drain(wait: float) -> None:
        for key, _ in sel.select(wait):
            s = key.fileobj
            while True:
                try:
                    data = s.recv(65535)
                except BlockingIOError:
                    break
                if len(data) >= HEADER.size:
                    seq, flow, t_ns = HEADER.unpack_from(data)
                    if seq not in seen:
                        seen.add(seq)
                        recv[flow] += 1
                        rtts.append((time.monotonic_ns() - t_ns) / 1000.0)

    start = time.monotonic()
    for seq in range(args.count):
        flow = seq % args.flows
        due = start + seq * args.interval
        while True:
            now = time.monotonic()
            if now >= due:
                break
            if args.echo:
                drain(due - now)
            else:
                time.sleep(due - now)
        try:
            socks[flow].sendto(HEADER.pack(seq, flow, time.monotonic_ns()) + pad, (dst, args.port))
            sent[flow] += 1
        except OSError:
            pass  # unreachable and friends: counted as lost
        if args.echo:
            drain(0)
    if args.echo:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and sum(recv) < sum(sent):
            drain(min(0.05, max(0.0, deadline - time.monotonic())))
    rtts.sort()

    def pct(q: float) -> float | None:
        return round(rtts[min(len(rtts) - 1, int(q * len(rtts)))], 1) if rtts else None

    ports = [s.getsockname()[1] for s in socks]
    result = {"src": args.src, "dst": dst, "count": args.count, "sent": sum(sent), "flows": args.flows}
    if args.echo:
        result |= {"received": sum(recv), "lost": args.count - sum(recv),
                   "flows_answered": sum(1 for r in recv if r), "rtt_us": {"p50": pct(0.5), "p99": pct(0.99)},
                   "per_flow": [[ports[i], sent[i], recv[i]] for i in range(args.flows)]}
    for s in socks:
        s.close()
    return result


def tcp_sink(args: argparse.Namespace) -> int:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args.bind, args.port))
    srv.listen(1)
    srv.settimeout(args.max_time)
    _ready()
    conn, _ = srv.accept()
    total = 0
    first = last = None
    conn.settimeout(args.max_time)
    while True:
        data = conn.recv(1 << 16)
        if not data:
            break
        now = time.monotonic()
        first = first or now
        last = now
        total += len(data)
    seconds = (last - first) if first and last and last > first else 0.0
    print(json.dumps({"bytes": total, "seconds": round(seconds, 4),
                      "mbit_s": round(total * 8 / seconds / 1e6, 3) if seconds else None}), flush=True)
    return 0


def tcp_send(args: argparse.Namespace) -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((args.src, 0))
    s.settimeout(10)
    s.connect((args.dst, args.port))
    chunk = b"\xa5" * (1 << 16)
    total = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        total += s.send(chunk)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(30)
    while s.recv(1 << 16):
        pass
    s.close()
    print(json.dumps({"bytes": total}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="UDP echo responder")
    p.add_argument("--bind", default="0.0.0.0")  # noqa: S104 (inside a namespace)
    p.add_argument("--port", type=int, default=7000)
    p.set_defaults(func=serve)
    p = sub.add_parser("sink", help="count UDP datagrams until --quiet seconds pass without one")
    p.add_argument("--bind", default="0.0.0.0")  # noqa: S104 (inside a namespace)
    p.add_argument("--port", type=int, default=7001)
    p.add_argument("--quiet", type=float, default=0.5, help="stop this long after the last datagram")
    p.add_argument("--max-time", type=float, default=30.0, help="stop after this long regardless")
    p.set_defaults(func=sink)
    p = sub.add_parser("send", help="send UDP datagrams over several flows (source ports)")
    p.add_argument("--src", required=True, help="source address (a NIC address of this host)")
    p.add_argument("--dst", required=True, action="append", help="destination address (repeatable)")
    p.add_argument("--port", type=int, default=7000)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--flows", type=int, default=1, help="sockets, each with its own source port")
    p.add_argument("--sport-base", type=int, default=0, help="bind flow i to this port + i (0: ephemeral)")
    p.add_argument("--interval", type=float, default=0.0005, help="seconds between datagrams")
    p.add_argument("--size", type=int, default=64, help="datagram payload bytes")
    p.add_argument("--echo", action="store_true", help="expect echoes, report received, lost, RTT")
    p.add_argument("--timeout", type=float, default=1.0, help="wait this long for late echoes")
    p.set_defaults(func=send)
    p = sub.add_parser("tcp-sink", help="receive one TCP stream and report its throughput")
    p.add_argument("--bind", default="0.0.0.0")  # noqa: S104 (inside a namespace)
    p.add_argument("--port", type=int, default=7002)
    p.add_argument("--max-time", type=float, default=60.0)
    p.set_defaults(func=tcp_sink)
    p = sub.add_parser("tcp-send", help="send a TCP stream as fast as possible")
    p.add_argument("--src", required=True)
    p.add_argument("--dst", required=True)
    p.add_argument("--port", type=int, default=7002)
    p.add_argument("--seconds", type=float, default=2.0)
    p.set_defaults(func=tcp_send)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
