"""A resent eager chunk read on two streams at once: the plugin's receiver against a sender
that speaks the plugin's wire protocol itself, so the interleaving a failover makes by chance
(a chunk's first copy still coming on the old path while its resend arrives on the new one)
happens every time, in this order.

    python dupchunk.py --lib L --size BYTES

Run with LOCKSTEP_NCCL_NICS naming one interface, LOCKSTEP_NCCL_EAGER_BYTES at least BYTES but
less than twice BYTES, and LOCKSTEP_NCCL_HEARTBEAT_MS long enough that the quiet path stays up.
Message 0 (BYTES, one chunk, not yet matched: an eager chunk) goes as two copies, one on each of
two streams: both headers and all but the last MiB of each payload first, and only once the
receiver has read them (its socket's queue is empty), the rest. Then message 1 the same size,
sent before its receive is posted, must find the eager buffer free again. Prints one JSON line;
exit status 0 only when both messages arrived intact and no call returned an error.
"""

from __future__ import annotations

import argparse
import ctypes as C
import fcntl
import os
import random
import select
import socket
import struct
import sys
import termios
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from netplugin import HANDLE_SIZE, Plugin, run_and_report  # noqa: E402

MAGIC = 0x4C53
HELLO, HELLO_ACK, DATA = 1, 2, 3
EAGER = 0xFFFFFFFF
HDR = struct.Struct("<IIQQQIIQiI")  # ls_hdr: type, len, a, b, c, d, e, msg, tag, pad (56 bytes)
TAIL = 1 << 20
WAIT_S = 30
SIOCOUTQ = termios.TIOCOUTQ


def hdr(kind: int, length: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0, e: int = 0, msg: int = 0,
        tag: int = 0) -> bytes:
    return HDR.pack(MAGIC << 16 | kind, length, a, b, c, d, e, msg, tag, 0)


def hello(token: int, conn_token: int, stream: int) -> bytes:
    return hdr(HELLO, 16, a=token, b=stream) + struct.pack("<QII", conn_token, 1, 0)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise ConnectionError("the receiver closed the stream")
        out += got
    return out


def peer_fd(mine: socket.socket) -> int:
    """The plugin's own end of one of our connections (it lives in this process), once accepted."""
    want = (mine.getpeername(), mine.getsockname())
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                if fd == mine.fileno() or not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    continue
                s = socket.socket(fileno=os.dup(fd))
            except OSError:  # closed meanwhile (the listing's own descriptor, say)
                continue
            try:
                if s.type == socket.SOCK_STREAM and (s.getsockname(), s.getpeername()) == want:
                    return fd
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.001)
    raise TimeoutError(f"the plugin never accepted {want}")


def queued(fd: int, request: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0]


class Receiver:
    """The plugin's receive side, driven as NCCL drives it; test() is polled while we wait."""

    def __init__(self, plugin: Plugin, comm):
        self.plugin, self.comm = plugin, comm
        self.mh = C.c_void_p()
        plugin.check(plugin.net.regMr(comm, None, 0, 1, C.byref(self.mh)), "regMr")
        self.req = None

    def post(self, size: int, tag: int):
        self.buf = C.create_string_buffer(size)
        ptrs, sizes = (C.c_void_p * 1)(C.addressof(self.buf)), (self.plugin.size_t * 1)(size)
        tags, mhs = (C.c_int * 1)(tag), (C.c_void_p * 1)(self.mh.value)
        req = C.c_void_p()
        self.plugin.check(self.plugin.net.irecv(self.comm, 1, ptrs, sizes, tags, mhs, None, C.byref(req)), "irecv")
        assert req.value, "irecv asked for a retry with nothing outstanding"
        self.req = req

    def done(self) -> bool:
        """test() on the posted receive (raises PluginError on an error)."""
        if self.req is None:
            return False
        flag, sizes = C.c_int(), (C.c_int * 8)()
        self.plugin.check(self.plugin.net.test(self.req, C.byref(flag), sizes), "test")
        if flag.value:
            self.size_got = sizes[0]
        return bool(flag.value)

    def wait(self, cond, what: str):
        deadline = time.monotonic() + WAIT_S
        while not cond():
            self.done()  # an error from the plugin ends the wait at once
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(0.001)


def send_all(rx: Receiver, sock: socket.socket, data: bytes) -> None:
    """Non-blocking, polling test() meanwhile: a receiver that stopped reading on an error says so."""
    view, off = memoryview(data), 0
    deadline = time.monotonic() + WAIT_S
    while off < len(data):
        try:
            off += sock.send(view[off:])
        except BlockingIOError:
            rx.done()
            if time.monotonic() > deadline:
                raise TimeoutError("the receiver stopped reading") from None
            select.select([], [sock], [], 0.01)


def send_twice(rx: Receiver, streams, msg: int, seq: int, data: bytes, tag: int) -> None:
    """Both copies' headers and payloads but the tail, read by the receiver; then both tails."""
    head = hdr(DATA, len(data), a=seq, b=len(data), c=0, d=0, e=EAGER, msg=msg, tag=tag)
    for mine, theirs in streams:
        send_all(rx, mine, head + data[:-TAIL])
        rx.wait(lambda m=mine, t=theirs: queued(m.fileno(), SIOCOUTQ) == 0 and queued(t, termios.FIONREAD) == 0,
                "the receiver reading the first part of a copy")
    for mine, _ in streams:
        send_all(rx, mine, data[-TAIL:])


def run(plugin: Plugin, size: int) -> dict:
    plugin.init()
    handle = C.create_string_buffer(HANDLE_SIZE)
    listen_comm = plugin.listen(handle)
    addr, port = socket.inet_ntoa(handle.raw[4:8]), struct.unpack(">H", handle.raw[8:10])[0]
    token = struct.unpack_from("<Q", handle.raw, 16)[0]
    conn_token = random.getrandbits(64)
    s0 = socket.create_connection((addr, port), timeout=WAIT_S)
    s0.sendall(hello(token, conn_token, 0))
    comm = None
    deadline = time.monotonic() + WAIT_S
    while comm is None:
        comm = plugin.accept_once(listen_comm)
        if time.monotonic() > deadline:
            raise TimeoutError("accept")
    plugin.check(plugin.net.closeListen(listen_comm), "closeListen")
    socks = [s0]
    try:
        h = HDR.unpack(recv_exact(s0, HDR.size))
        assert h[0] == MAGIC << 16 | HELLO_ACK, h
        ack = recv_exact(s0, h[1])
        eager_bytes = struct.unpack_from("<I", ack, 4)[0]
        l_addr, l_port = socket.inet_ntoa(ack[8:12]), struct.unpack(">H", ack[12:14])[0]
        s1 = socket.create_connection((l_addr, l_port), timeout=WAIT_S)
        socks.append(s1)
        s1.sendall(hello(token, conn_token, 1))
        for s in socks:
            s.setblocking(False)
        rx = Receiver(plugin, comm)
        streams = [(s1, peer_fd(s1)), (s0, peer_fd(s0))]
        rng = random.Random(size)
        received = 0
        for msg in (0, 1):
            data, tag = rng.randbytes(size), 100 + msg
            if msg == 0:  # posted first: the copies still wait in the eager buffer until one is whole
                rx.post(size, tag)
                send_twice(rx, streams, msg, msg, data, tag)
            else:  # sent first: the eager buffer must hold it (message 0's copies are all gone)
                send_twice(rx, streams, msg, msg, data, tag)
                rx.post(size, tag)
            rx.wait(rx.done, f"message {msg} to arrive")
            assert rx.size_got == size, f"message {msg}: test reported {rx.size_got} bytes, sent {size}"
            assert rx.buf.raw == data, f"message {msg}: the bytes differ from what was sent"
            received += size
            rx.req = None
        plugin.check(plugin.net.deregMr(comm, rx.mh), "deregMr")
        return {"bytes": received, "eager_bytes": eager_bytes}
    finally:
        for s in socks:
            s.close()
        plugin.net.closeRecv(comm)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--size", type=int, default=16 << 20)
    args = parser.parse_args(argv)
    plugin = Plugin(args.lib, 12)
    return run_and_report(plugin, lambda: run(plugin, args.size), {"ok": False},
                          errors=(AssertionError, TimeoutError, ConnectionError))


if __name__ == "__main__":
    sys.exit(main())
