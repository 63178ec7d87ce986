"""Framed messages between a training process and its own background worker.

A private ``socketpair`` between two processes of the same job (never a listening socket), so
messages are pickles: an 8-byte length, then the pickle. File descriptors (arena memfds) travel
as ``SCM_RIGHTS`` ancillary data on the first byte of a frame.
"""

from __future__ import annotations

import pickle
import select
import socket
import struct
import threading
from typing import Any

_HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 30  # a layout of a million tensors is far below this; anything larger is a bug


class ChannelClosed(EOFError):
    """The other process closed its end (exited, or was killed)."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._send_lock = threading.Lock()  # a frame is written whole even from two threads

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, obj: Any, fds: list[int] | tuple[int, ...] = ()) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        header = _HEADER.pack(len(data))
        try:
            with self._send_lock:
                if fds:
                    socket.send_fds(self.sock, [header], list(fds))
                    self.sock.sendall(data)
                else:
                    self.sock.sendall(header + data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def poll(self, timeout: float | None = 0.0) -> bool:
        """True when a frame (or EOF) is waiting."""
        readable, _, _ = select.select([self.sock], [], [], timeout)
        return bool(readable)

    def recv(self, timeout: float | None = None) -> tuple[Any, list[int]]:
        """The next frame and the descriptors that came with it; TimeoutError if none in time."""
        if timeout is not None and not self.poll(timeout):
            raise TimeoutError("no message")
        try:
            head, fds, _flags, _addr = socket.recv_fds(self.sock, _HEADER.size, 8)
        except ConnectionResetError as exc:
            raise ChannelClosed(str(exc)) from exc
        if not head:
            raise ChannelClosed("peer closed the channel")
        if len(head) < _HEADER.size:
            head += self._exactly(_HEADER.size - len(head))
        (length,) = _HEADER.unpack(head)
        if length > MAX_FRAME:
            raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME}")
        return pickle.loads(self._exactly(length)), list(fds)  # noqa: S301 - our own worker's frames

    def _exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ChannelClosed("peer closed the channel mid-frame")
            got += k
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def serve_background(serve) -> None:
    """The body of a background process's ``main()`` (``engine.BackgroundProcess``) whose first
    message is ``("init", config)``: ``serve(channel, config, fds)``, then exit without interpreter
    teardown (torch's is slow), status 0 when it returned or the parent closed the channel.

    One torch thread: the process shares the training job's cores.
    """
    import os
    import sys
    import traceback

    import torch

    torch.set_num_threads(1)
    channel = Channel(socket.socket(fileno=int(sys.argv[1])))
    status = 0
    try:
        msg, fds = channel.recv()
        if msg[0] != "init":
            raise ValueError(f"expected init, got {msg[0]!r}")
        serve(channel, msg[1], fds)
    except ChannelClosed:
        pass
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
