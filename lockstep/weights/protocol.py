"""The weight-push wire format, between a publisher's leader process and rollout replicas.

Everything that crosses the network is JSON frames (a 4-byte big-endian length, then UTF-8
JSON, at most 16 MiB) or raw tensor bytes whose extent a frame announced: nothing received is
ever unpickled, and every frame is checked against the layout before a byte is written.

Control connection (replica -> leader), frames by ``op``:
  replica: ``hello {replica, token}``, ``received {version}``, ``applied {version}``
  leader:  ``layout {publisher, tensors: [[key, dtype, shape, nbytes]...], streams, transport,
           epoch, data_port | store_port}``, ``refused {error}`` (data links go to the host the
           replica reached the control port at)
Data link (one per replica and stream): ``data {replica, stream, token}`` opens it (TCP); then
per version a header ``{version, segments: [[tensor, byte offset, nbytes], ...], changed_at}``
followed by the segments' bytes in order.
"""

from __future__ import annotations

import json
import socket
import struct

import torch

MAX_FRAME = 16 << 20
_LEN = struct.Struct("!I")

DTYPES = {
    str(d): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
        torch.float8_e4m3fn, torch.float8_e5m2,
    )
}


class ProtocolError(ValueError):
    """A peer sent something that is not a valid frame of this protocol."""


def send_frame(sock: socket.socket, obj: dict) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    # MSG_WAITALL: the kernel fills the whole view in one call (one release of the GIL, instead of
    # one per socket-buffer's worth); the loop only resumes after a signal.
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k


def recv_frame(sock: socket.socket) -> dict:
    (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    try:
        obj = json.loads(recv_exact(sock, n))
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame is a {type(obj).__name__}, not an object")
    return obj


def parse_layout(tensors: object) -> list[tuple[str, torch.dtype, tuple[int, ...], int]]:
    """Validate the ``tensors`` of a layout frame: names, known dtypes, sizes that add up."""
    if not isinstance(tensors, list) or not tensors:
        raise ProtocolError("layout.tensors must be a non-empty list")
    out = []
    for i, entry in enumerate(tensors):
        if not (isinstance(entry, list) and len(entry) == 4):
            raise ProtocolError(f"layout.tensors[{i}] must be [key, dtype, shape, nbytes]")
        key, dtype, shape, nbytes = entry
        if not isinstance(key, str) or dtype not in DTYPES:
            raise ProtocolError(f"layout.tensors[{i}]: bad key or dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
            raise ProtocolError(f"layout.tensors[{i}].shape must be a list of sizes")
        numel = 1
        for s in shape:
            numel *= s
        if nbytes != numel * DTYPES[dtype].itemsize:
            raise ProtocolError(f"layout.tensors[{i}]: nbytes {nbytes} does not match {dtype} {shape}")
        out.append((key, DTYPES[dtype], tuple(shape), nbytes))
    return out


def parse_segments(segments: object, sizes: list[int]) -> list[tuple[int, int, int]]:
    """Validate a data header's segments against the tensor sizes of the layout."""
    if not isinstance(segments, list):
        raise ProtocolError("segments must be a list")
    out = []
    for i, seg in enumerate(segments):
        if not (isinstance(seg, list) and len(seg) == 3 and all(isinstance(x, int) for x in seg)):
            raise ProtocolError(f"segments[{i}] must be [tensor, offset, nbytes]")
        t, off, n = seg
        if not (0 <= t < len(sizes) and off >= 0 and n > 0 and off + n <= sizes[t]):
            raise ProtocolError(f"segments[{i}] = {seg} is outside the layout")
        out.append((t, off, n))
    return out
