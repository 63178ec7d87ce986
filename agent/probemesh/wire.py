"""The probe mesh's wire format (UDP payloads), as ``native/probed.h`` defines it.

All integers are big-endian. A probe (and a trace probe) is a 32-byte header, the prober NIC's
name, and zero padding up to the plan's ``payload_bytes`` (at least 72 bytes, so its echo fits)::

    0  magic "LSPM"   4 version 1   5 type (1 probe, 3 trace)   6 flags (1: times are cluster time)
    7  name length    8 session u32 (the prober's, per peer)   12 seq u32 (a trace: its TTL)
    16 window_ns i64 (the prober's window this probe counts in)  24 tx_ns i64 (its send time)
    32 name

An echo (type 2; 4 for a trace) has the probe's length, the probe's bytes replaced by::

    6  flags (1: cluster time, 2: follow-up valid, 4: hardware stamps)   8 session  12 seq
    16 rx_ns (kernel receive stamp of the probe)  24 tx_ns (the responder's send time)
    32 seen u64 (bit i: the responder had received seq - 1 - i of this session)
    40 fu_seq u32  48 fu_tx_ns (kernel TX stamp of the echo of fu_seq)
    56 rx_hw_ns  64 fu_tx_hw_ns
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

MAGIC = b"LSPM"
VERSION = 1
PROBE, ECHO, TRACE, TRACE_ECHO = 1, 2, 3, 4
F_SYNCED, F_FOLLOWUP, F_HW = 1, 2, 4
PROBE_HDR = struct.Struct("!4sBBBBIIqq")
ECHO_BODY = struct.Struct("!4sBBBBIIqqQIIqqq")
ECHO_LEN = ECHO_BODY.size  # 72
_NAME_RE = re.compile(rb'^[!#-\[\]-~]{1,64}$')


def name_ok(name: str) -> bool:
    return bool(name) and _NAME_RE.match(name.encode()) is not None


@dataclass(frozen=True)
class Message:
    type: int
    flags: int
    session: int
    seq: int
    window_ns: int = 0
    tx_ns: int = 0
    name: str = ""
    rx_ns: int = 0
    seen: int = 0
    fu_seq: int = 0
    fu_tx_ns: int = 0

    @property
    def synced(self) -> bool:
        return bool(self.flags & F_SYNCED)


def probe(kind: int, session: int, seq: int, window_ns: int, tx_ns: int, name: str, synced: bool,
          payload: int = 0) -> bytes:
    raw = name.encode()
    head = PROBE_HDR.pack(MAGIC, VERSION, kind, F_SYNCED if synced else 0, len(raw), session & 0xFFFFFFFF,
                          seq & 0xFFFFFFFF, window_ns, tx_ns) + raw
    return head.ljust(max(ECHO_LEN, payload, len(head)), b"\0")


def echo(kind: int, session: int, seq: int, rx_ns: int, tx_ns: int, seen: int, synced: bool, length: int,
         fu: tuple[int, int] | None = None) -> bytes:
    flags = (F_SYNCED if synced else 0) | (F_FOLLOWUP if fu else 0)
    fu_seq, fu_tx = fu or (0, 0)
    body = ECHO_BODY.pack(MAGIC, VERSION, kind, flags, 0, session & 0xFFFFFFFF, seq & 0xFFFFFFFF, rx_ns, tx_ns,
                          seen & 0xFFFFFFFFFFFFFFFF, fu_seq & 0xFFFFFFFF, 0, fu_tx, 0, 0)
    return body + b"\0" * max(0, length - len(body))


def parse(data: bytes, find: bool = False) -> Message | None:
    """A probe or echo, or None. With `find`, the message may start after headers (an ICMP quote)."""
    start = 0
    if find:
        start = data.find(MAGIC, 0, 160)
        if start < 0:
            return None
    if len(data) - start < PROBE_HDR.size:
        return None
    magic, version, kind, flags, nlen, session, seq, a, b = PROBE_HDR.unpack_from(data, start)
    if magic != MAGIC or version != VERSION:
        return None
    if kind in (PROBE, TRACE):
        raw = data[start + PROBE_HDR.size:start + PROBE_HDR.size + nlen]
        if len(raw) != nlen:
            return None
        return Message(kind, flags, session, seq, window_ns=a, tx_ns=b, name=raw.decode("ascii", "replace"))
    if kind in (ECHO, TRACE_ECHO):
        if len(data) - start < ECHO_LEN:
            return None
        f = ECHO_BODY.unpack_from(data, start)
        return Message(kind, flags, session, seq, rx_ns=f[7], tx_ns=f[8], seen=f[9], fu_seq=f[10], fu_tx_ns=f[12])
    return None
