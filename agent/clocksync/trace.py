"""The probe trace ``lockstep.clocktrace/v1``: validation and the arrays the estimator fits.

A trace is the timestamps of coded probes exchanged by hosts A and B (``../shared/formats/clock.md``):
``dir`` ``ab`` (``tx`` on A's clock, ``rx`` on B's) or ``ba`` (``tx`` on B's, ``rx`` on A's), the
two packets of a probe share ``id`` with ``seq`` 0 and 1, sent ``gap_ns`` apart. Timestamps are
integer nanoseconds near 1.8e18, beyond what a double holds exactly, so everything here is kept
as int64 and differenced as integers before any floating-point step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

TRACE_FORMAT = "lockstep.clocktrace/v1"
ESTIMATE_FORMAT = "lockstep.clockestimate/v1"
MAX_PROBES = 2_000_000
_INT64_MAX = 2**63 - 1


class TraceError(ValueError):
    """An invalid trace; ``key`` names the field (``probes[12].tx``), ``value`` what it held."""

    def __init__(self, key: str, problem: str, value: Any = None, index: int | None = None):
        self.key, self.problem, self.value, self.index = key, problem, value, index
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{key}: {problem} (got {shown})")


@dataclass(frozen=True)
class Trace:
    """One packet per row. ``fwd`` is True for ``ab``. Times are int64 nanoseconds."""

    a: str
    b: str
    gap_ns: int | None
    t_ref_ns: int
    fwd: np.ndarray  # bool
    probe_id: np.ndarray  # int64
    seq: np.ndarray  # int8: 0 or 1
    tx: np.ndarray  # int64, on the sender's clock
    rx: np.ndarray  # int64, on the receiver's clock

    def __len__(self) -> int:
        return int(self.tx.shape[0])

    @property
    def a_time(self) -> np.ndarray:
        """Each packet's time on A's clock (``tx`` when A sent it, ``rx`` when A received it)."""
        return np.where(self.fwd, self.tx, self.rx)

    def to_document(self) -> dict:
        probes = [
            {"dir": "ab" if f else "ba", "id": int(i), "seq": int(s), "tx": int(t), "rx": int(r)}
            for f, i, s, t, r in zip(self.fwd, self.probe_id, self.seq, self.tx, self.rx, strict=True)
        ]
        doc = {"format": TRACE_FORMAT, "a": self.a, "b": self.b, "t_ref_ns": int(self.t_ref_ns), "probes": probes}
        if self.gap_ns is not None:
            doc["gap_ns"] = int(self.gap_ns)
        return doc


def _int(value: Any, key: str, index: int | None = None, lo: int = 0, hi: int = _INT64_MAX) -> int:
    # bool is an int in Python; a timestamp of True is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        else:
            raise TraceError(key, "must be an integer", value, index)
    if not lo <= value <= hi:
        raise TraceError(key, f"must be between {lo} and {hi}", value, index)
    return value


def _name(doc: dict, key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise TraceError(key, "must be a non-empty string of at most 200 characters", value)
    return value


def parse_trace(doc: Any) -> Trace:
    """Validate a ``lockstep.clocktrace/v1`` document; raises :class:`TraceError` naming the field."""
    if not isinstance(doc, dict):
        raise TraceError("(document)", "must be a JSON object", type(doc).__name__)
    if doc.get("format") != TRACE_FORMAT:
        raise TraceError("format", f"must be {TRACE_FORMAT!r}", doc.get("format"))
    a, b = _name(doc, "a"), _name(doc, "b")
    gap = doc.get("gap_ns")
    gap_ns = None if gap is None else _int(gap, "gap_ns", lo=1, hi=10**9)
    if "t_ref_ns" not in doc:
        raise TraceError("t_ref_ns", "is required", None)
    t_ref_ns = _int(doc["t_ref_ns"], "t_ref_ns")
    probes = doc.get("probes")
    if not isinstance(probes, list):
        raise TraceError("probes", "must be a list", type(probes).__name__)
    if len(probes) > MAX_PROBES:
        raise TraceError("probes", f"at most {MAX_PROBES} packets", len(probes))
    n = len(probes)
    fwd = np.empty(n, dtype=bool)
    ids = np.empty(n, dtype=np.int64)
    seq = np.empty(n, dtype=np.int8)
    tx = np.empty(n, dtype=np.int64)
    rx = np.empty(n, dtype=np.int64)
    seen: dict[tuple[int, int], int] = {}
    id_dir: dict[int, bool] = {}
    for i, p in enumerate(probes):
        key = f"probes[{i}]"
        if not isinstance(p, dict):
            raise TraceError(key, "must be an object", type(p).__name__, i)
        direction = p.get("dir")
        if direction not in ("ab", "ba"):
            raise TraceError(f"{key}.dir", "must be 'ab' or 'ba'", direction, i)
        fwd[i] = direction == "ab"
        ids[i] = _int(p.get("id"), f"{key}.id", i)
        s = p.get("seq", 0)
        if s not in (0, 1) or isinstance(s, bool):
            raise TraceError(f"{key}.seq", "must be 0 or 1", s, i)
        seq[i] = s
        tx[i] = _int(p.get("tx"), f"{key}.tx", i)
        rx[i] = _int(p.get("rx"), f"{key}.rx", i)
        pid = int(ids[i])
        if (pid, s) in seen:
            raise TraceError(f"{key}.seq", f"probe {pid} already has a packet with this seq "
                                           f"(probes[{seen[pid, s]}])", s, i)
        seen[pid, s] = i
        if id_dir.setdefault(pid, bool(fwd[i])) != bool(fwd[i]):
            raise TraceError(f"{key}.dir", f"probe {pid} has packets in both directions", direction, i)
    if n:
        # Timestamps of one window lie within a day of each other and of t_ref_ns; anything
        # else is a unit mistake (seconds, microseconds) or a corrupted value, not a trace.
        span_lo = int(min(tx.min(), rx.min(), t_ref_ns))
        span_hi = int(max(tx.max(), rx.max(), t_ref_ns))
        if span_hi - span_lo > 86400 * 10**9:
            worst = int(np.argmax(np.abs(np.concatenate([tx, rx]) - np.int64(t_ref_ns))) % n)
            raise TraceError(f"probes[{worst}]", "timestamps must lie within a day of each other and of "
                             "t_ref_ns (integer nanoseconds)", {"tx": int(tx[worst]), "rx": int(rx[worst])}, worst)
    return Trace(a, b, gap_ns, t_ref_ns, fwd, ids, seq, tx, rx)
