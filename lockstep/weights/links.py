"""Data links of a weight push: one per (replica, stream), over TCP or a torch.distributed pair group.

A link carries, per version, one JSON header and then the bytes of the segments it names, read
straight from the publisher's shared arena and written straight into the replica's buffers.

- ``TcpLink``: a TCP connection (``sendall`` of arena memoryviews, ``recv_into`` tensor bytes).
- ``PairGroupLink``: a two-rank ``torch.distributed`` process group of its own (rank 0 the
  leader's sender, rank 1 the replica), rendezvous through the leader's ``TCPStore`` under a
  prefix unique to the link. Up to ``WINDOW`` segments are in flight each way (gloo matches
  sends and receives of one tag in order), so a link does not stop for a round trip between
  segments. ``backend="gloo"`` here; the same code drives ``ProcessGroupNCCL``
  where the segments are CUDA tensors (see ``lockstep/weights/README.md``).
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections import deque
from datetime import timedelta

import torch

from lockstep.weights.protocol import MAX_FRAME, ProtocolError, recv_frame, recv_into_exact, send_frame


class TcpLink:
    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock

    def send_version(self, header: dict, parts: list[tuple[memoryview, int]], wait=None) -> None:
        """The header, then each part once ``wait(end)`` says the bytes under it are staged."""
        send_frame(self.sock, header)
        for view, end in parts:
            if wait is not None:
                wait(end)
            self.sock.sendall(view)

    def recv_header(self) -> dict:
        return recv_frame(self.sock)

    def recv_segments(self, views: list[memoryview]) -> None:
        for view in views:
            recv_into_exact(self.sock, view)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class PairGroupLink:
    TAG = 7
    WINDOW = 4  # segments posted ahead of the one being completed

    def __init__(self, store, prefix: str, rank: int, *, backend: str = "gloo", timeout_s: float = 300.0):
        import torch.distributed as dist

        self.rank = rank
        self.peer = 1 - rank
        pair_store = dist.PrefixStore(prefix, store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(pair_store, rank, 2, timedelta(seconds=timeout_s))
        elif backend == "nccl":
            self.pg = dist.ProcessGroupNCCL(pair_store, rank, 2)
        else:
            raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")

    def _send(self, t: torch.Tensor) -> None:
        self.pg.send([t], self.peer, self.TAG).wait()

    def _recv(self, t: torch.Tensor) -> None:
        self.pg.recv([t], self.peer, self.TAG).wait()

    def send_version(self, header: dict, parts: list[tuple[memoryview, int]], wait=None) -> None:
        data = json.dumps(header, separators=(",", ":")).encode()
        self._send(torch.tensor([len(data)], dtype=torch.int64))
        self._send(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        posted: deque = deque()
        for view, end in parts:
            if wait is not None:
                wait(end)
            posted.append(self.pg.send([torch.frombuffer(view, dtype=torch.uint8)], self.peer, self.TAG))
            if len(posted) > self.WINDOW:
                posted.popleft().wait()
        while posted:
            posted.popleft().wait()

    def recv_header(self) -> dict:
        n = torch.zeros(1, dtype=torch.int64)
        self._recv(n)
        size = int(n.item())
        if not 0 < size <= MAX_FRAME:
            raise ProtocolError(f"header of {size} bytes")
        buf = torch.empty(size, dtype=torch.uint8)
        self._recv(buf)
        header = json.loads(bytes(buf.numpy()))
        if not isinstance(header, dict):
            raise ProtocolError("header is not an object")
        return header

    def recv_segments(self, views: list[memoryview]) -> None:
        posted: deque = deque()
        for view in views:
            posted.append(self.pg.recv([torch.frombuffer(view, dtype=torch.uint8)], self.peer, self.TAG))
            if len(posted) > self.WINDOW:
                posted.popleft().wait()
        while posted:
            posted.popleft().wait()

    def close(self) -> None:
        with contextlib.suppress(AttributeError, RuntimeError):
            self.pg.abort()
