"""The state that differs between data-parallel ranks, and its copy off the rank.

Parameters and optimizer state are the same on every data-parallel rank, so a dead rank's copy
comes from a survivor. What differs -- random-number-generator states (torch CPU and CUDA,
Python's ``random``, NumPy's global generator, the ``torch.Generator`` objects that drive data
loading), module buffers (batch-norm statistics are computed on each rank's data) and the
position of each data-loader iterator -- is small, and must survive its rank. The rank writes it
at every step into a shared-memory file owned by its node's supervisor (``lockstep run``), at
three points of the step:

* ``post`` -- after ``optimizer.step()`` (a step boundary: everything, including data positions);
* ``mid``  -- when the first gradient bucket is handed to the process group (the forward pass is
  done: buffers are final for the step and the RNG has advanced through dropout);
* ``pre``  -- before ``optimizer.step()``.

A replacement re-running a step whose parameters it cannot know exactly (the survivors already
stepped) pins RNG and buffers to ``mid``/``pre``, so nothing the survivors kept is lost.

Each point has two slots guarded by a sequence counter (odd while writing): a rank killed in the
middle of a write leaves the other slot intact. Rare events (a data-loader iterator created, one
exhausted) go to an append-only record file beside it. Everything is in ``/dev/shm`` (page cache:
it survives the process, not the node; the supervisor forwards copies off the node).

The payload is a small self-describing binary map (no pickle: the reader is another process).
"""

from __future__ import annotations

import json
import mmap
import os
import struct

MAGIC = b"LSS1"
_SLOT_HEADER = struct.Struct("<QqQ")  # seq (odd while writing), step, payload length
_HEADER_SIZE = 64
KINDS = ("post", "mid", "pre")


def encode(fields: dict[str, bytes]) -> bytes:
    parts = [MAGIC, struct.pack("<H", len(fields))]
    for name, value in fields.items():
        nb = name.encode()
        parts.append(struct.pack("<BQ", len(nb), len(value)))
        parts.append(nb)
        parts.append(value)
    return b"".join(parts)


def decode(data: bytes | memoryview) -> dict[str, bytes]:
    data = bytes(data)
    if data[:4] != MAGIC:
        raise ValueError("not a Lockstep small-state payload")
    (n,) = struct.unpack_from("<H", data, 4)
    off = 6
    out: dict[str, bytes] = {}
    for _ in range(n):
        nlen, vlen = struct.unpack_from("<BQ", data, off)
        off += 9
        name = data[off:off + nlen].decode()
        off += nlen
        out[name] = data[off:off + vlen]
        off += vlen
    return out


class SlotWriter:
    """Two alternating slots in one file; ``write`` is a memcpy into the mapping."""

    def __init__(self, path: str, capacity: int = 64 << 10):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._map: mmap.mmap | None = None
        self._capacity = 0
        self._writes = 0
        self._grow(capacity)

    def _grow(self, capacity: int):
        if self._map is not None:
            self._map.close()
        self._capacity = capacity
        os.ftruncate(self._fd, 2 * (_HEADER_SIZE + capacity))
        self._map = mmap.mmap(self._fd, 2 * (_HEADER_SIZE + capacity))

    def write(self, step: int, payload: bytes):
        if len(payload) > self._capacity:
            self._grow(2 * len(payload))
        slot = self._writes & 1
        base = slot * (_HEADER_SIZE + self._capacity)
        m = self._map
        seq = _SLOT_HEADER.unpack_from(m, base)[0]
        _SLOT_HEADER.pack_into(m, base, seq + 1, step, len(payload))  # odd: writing
        m[base + _HEADER_SIZE: base + _HEADER_SIZE + len(payload)] = payload
        _SLOT_HEADER.pack_into(m, base, seq + 2, step, len(payload))
        self._writes += 1

    def close(self):
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self._fd)


def read_slots(path: str) -> tuple[int, bytes] | None:
    """The newest complete slot of a file: ``(step, payload)``, or None."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if not data:
        return None
    capacity = len(data) // 2 - _HEADER_SIZE
    best = None
    for slot in (0, 1):
        base = slot * (_HEADER_SIZE + capacity)
        seq, step, length = _SLOT_HEADER.unpack_from(data, base)
        if seq == 0 or seq & 1 or length > capacity:
            continue
        payload = data[base + _HEADER_SIZE: base + _HEADER_SIZE + length]
        if payload[:4] != MAGIC:
            continue
        if best is None or step > best[0]:
            best = (step, payload)
    return best


class SlotWatcher:
    """Notices a new complete slot in a rank's file without reading the file each time: what a
    node supervisor uses to forward the state off the node as it is written (a header read
    per poll; the payload is read once, when its sequence number changed)."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._size = 0
        self._seen = (0, 0)

    def poll(self) -> tuple[int, bytes] | None:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return None
        size = os.fstat(self._fd).st_size
        if size != self._size:
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self._fd, size, prot=mmap.PROT_READ) if size else None
            self._size = size
        if self._map is None:
            return None
        capacity = size // 2 - _HEADER_SIZE
        seqs = tuple(_SLOT_HEADER.unpack_from(self._map, slot * (_HEADER_SIZE + capacity))[0] for slot in (0, 1))
        if seqs == self._seen:
            return None
        best = None
        for slot in (0, 1):
            base = slot * (_HEADER_SIZE + capacity)
            seq, step, length = _SLOT_HEADER.unpack_from(self._map, base)
            if seq == 0 or seq & 1 or length > capacity:
                continue
            payload = bytes(self._map[base + _HEADER_SIZE: base + _HEADER_SIZE + length])
            if _SLOT_HEADER.unpack_from(self._map, base)[0] != seq or payload[:4] != MAGIC:
                continue  # overwritten while it was copied: the next poll sees it
            if best is None or step > best[0]:
                best = (step, payload)
        if not any(s & 1 for s in seqs):
            self._seen = seqs
        return best

    def rewind(self):
        """The next poll returns the latest slot again, changed or not."""
        self._seen = (0, 0)

    def close(self):
        if self._map is not None:
            self._map.close()
        if self._fd is not None:
            os.close(self._fd)


class RecordWriter:
    """Append-only records: ``<u32 json length><u32 blob length><json><blob>``."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, meta: dict, blob: bytes = b""):
        js = json.dumps(meta, separators=(",", ":")).encode()
        os.write(self._fd, struct.pack("<II", len(js), len(blob)) + js + blob)

    def close(self):
        os.close(self._fd)


def read_records(path: str) -> list[tuple[dict, bytes]]:
    return read_records_from(path, 0)[0]


def read_records_from(path: str, offset: int) -> tuple[list[tuple[dict, bytes]], int]:
    """The complete records from byte ``offset`` on, and the offset after the last of them (a
    supervisor copying the file off the node sends only what it has not sent yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    out = []
    off = 0
    while off + 8 <= len(data):
        jlen, blen = struct.unpack_from("<II", data, off)
        if off + 8 + jlen + blen > len(data):
            break  # a record cut short by the rank's death, or still being written
        meta = json.loads(data[off + 8: off + 8 + jlen])
        out.append((meta, data[off + 8 + jlen: off + 8 + jlen + blen]))
        off += 8 + jlen + blen
    return out, offset + off


def rank_paths(node_dir: str, rank: int) -> dict[str, str]:
    paths = {kind: os.path.join(node_dir, f"rank{rank}.{kind}") for kind in KINDS}
    paths["records"] = os.path.join(node_dir, f"rank{rank}.records")
    return paths


def read_rank_state(node_dir: str, rank: int) -> dict:
    """Everything a rank left on its node: ``{"post": (step, payload) | None, "mid": ..., "pre": ...,
    "records": [(meta, blob), ...]}`` -- what a replacement for it needs."""
    paths = rank_paths(node_dir, rank)
    state: dict = {kind: read_slots(paths[kind]) for kind in KINDS}
    state["records"] = read_records(paths["records"])
    return state
