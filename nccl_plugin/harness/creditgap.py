"""A credit the sender never gets: the plugin's sender against a receiver that speaks the
plugin's wire protocol itself, so the state a failover leaves by chance (a receive's credit
lost with a path, the receive filled by an eagerly sent message since, so no replay brings
the credit back) is there every time.

    python creditgap.py --lib L

Run with LOCKSTEP_NCCL_NICS naming one interface, LOCKSTEP_NCCL_STREAMS=1 and
LOCKSTEP_NCCL_HEARTBEAT_MS long enough that the quiet path stays up. The receiver announces a
64 KiB eager buffer. Message 0 (1,000 bytes) goes eagerly; the receiver never sends credit 0
but reports, as after such a failover, that it matched message 0 and fills receive 1, and
sends credit 1. Message 1 (256 KiB, too large for the eager buffer) must then come, matched
to receive 1. Prints one JSON line; exit status 0 only when both messages came intact, named
as they should be, and no call returned an error.
"""

from __future__ import annotations

import argparse
import ctypes as C
import os
import random
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netplugin import HANDLE_SIZE, Plugin, run_and_report  # noqa: E402

MAGIC, HANDLE_MAGIC = 0x4C53, 0x4C534E31
HELLO, HELLO_ACK, DATA, ACK, CREDIT, HEARTBEAT = 1, 2, 3, 4, 5, 6
EAGER = 0xFFFFFFFF
HDR = struct.Struct("<IIQQQIIQiI")  # ls_hdr: type, len, a, b, c, d, e, msg, tag, pad (56 bytes)
EAGER_BYTES = 64 << 10
MAX_NICS = 4
WAIT_S = 20  # well inside the heartbeat time: the sender keeps the quiet path meanwhile


def hdr(kind: int, length: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> bytes:
    return HDR.pack(MAGIC << 16 | kind, length, a, b, c, d, 0, 0, 0, 0)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("the sender closed the stream")
        out += got
    return out


def next_data(sock: socket.socket) -> tuple[tuple, bytes]:
    """The next DATA frame (heartbeats skipped); TimeoutError when none comes within WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        h = HDR.unpack(recv_exact(sock, HDR.size))
        payload = recv_exact(sock, h[1])
        if h[0] == MAGIC << 16 | DATA:
            return h, payload
        assert h[0] == MAGIC << 16 | HEARTBEAT, f"an unexpected frame {h}"


def run(plugin: Plugin, addr: str) -> dict:
    plugin.init()
    lsock = socket.create_server((addr, 0))
    port = lsock.getsockname()[1]
    token = random.getrandbits(64)
    raw = struct.pack("<I4s2sHIQ", HANDLE_MAGIC, socket.inet_aton(addr), struct.pack(">H", port), 0, 0, token)
    handle = C.create_string_buffer(raw.ljust(HANDLE_SIZE, b"\0"), HANDLE_SIZE)
    lsock.settimeout(0.001)
    sock, comm = None, None
    deadline = time.monotonic() + WAIT_S
    while comm is None:  # the plugin's non-blocking connect, and our side of it
        comm = plugin.connect_once(handle)
        if sock is None:
            try:
                sock, _ = lsock.accept()
            except TimeoutError:
                pass
            else:
                sock.settimeout(WAIT_S)
                h = HDR.unpack(recv_exact(sock, HDR.size))
                assert h[0] == MAGIC << 16 | HELLO and h[2] == token and h[3] == 0, h
                recv_exact(sock, h[1])
                ack = struct.pack("<II", 1, EAGER_BYTES) + (socket.inet_aton(addr) + struct.pack(">HH", port, 0)) * MAX_NICS
                sock.sendall(hdr(HELLO_ACK, len(ack)) + ack)
        if time.monotonic() > deadline:
            raise TimeoutError("connect")
    lsock.close()
    try:
        mh = C.c_void_p()
        plugin.check(plugin.net.regMr(comm, None, 0, 1, C.byref(mh)), "regMr")
        rng = random.Random(7)
        msgs = [(rng.randbytes(1000), 5), (rng.randbytes(256 << 10), 6)]
        bufs = []
        for data, tag in msgs:  # both complete at once (copied into the retransmit ring)
            bufs.append(C.create_string_buffer(data, len(data)))
            req = C.c_void_p()
            plugin.check(plugin.net.isend(comm, C.cast(bufs[-1], C.c_void_p), len(data), tag, mh, None, C.byref(req)), "isend")
            assert req.value, "isend asked for a retry with nothing outstanding"
            flag, size = C.c_int(), (C.c_int * 8)()
            plugin.check(plugin.net.test(req, C.byref(flag), size), "test")
        h, payload = next_data(sock)
        assert (h[2], h[6], h[7]) == (0, EAGER, 0) and payload == msgs[0][0], f"message 0 came as {h}"
        # matched message 0, receive 0 full, filling receive 1 (none of its buffers taken); no credit 0
        credit = struct.pack("<QiI", len(msgs[1][0]), msgs[1][1], 0)
        sock.sendall(hdr(ACK, 0, a=1, b=1, c=1, d=0) + hdr(CREDIT, len(credit), a=1, b=1, c=1, d=0) + credit)
        try:
            h, payload = next_data(sock)
        except TimeoutError:
            raise TimeoutError("message 1 never came: the sender waits for credit 0") from None
        assert (h[2], h[5], h[6], h[7]) == (1, 1, 0, 1), f"message 1 came as {h}, not matched to receive 1"
        assert payload == msgs[1][0], "message 1: the bytes differ from what was sent"
        sock.sendall(hdr(ACK, 0, a=2, b=2, c=2, d=0))  # everything received: closeSend need not wait
        plugin.check(plugin.net.deregMr(comm, mh), "deregMr")
        return {"bytes": sum(len(d) for d, _ in msgs)}
    finally:
        plugin.net.closeSend(comm)
        sock.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--addr", required=True, help="the address of the interface LOCKSTEP_NCCL_NICS names")
    args = parser.parse_args(argv)
    plugin = Plugin(args.lib, 12)
    return run_and_report(plugin, lambda: run(plugin, args.addr), {"ok": False},
                          errors=(AssertionError, TimeoutError, ConnectionError))


if __name__ == "__main__":
    sys.exit(main())
