"""Telemetry: the public emit API and the disk buffer behind it.

Features push records through the running daemon::

    from agent import telemetry
    telemetry.emit("probe.window", {"peer": "node001/nic0", "rtt_us_p50": 4.2})

A record is ``{"kind": "<dotted name>", "ts": <unix seconds>, "data": {...}}``
(protocol §5). ``emit`` validates it, appends it to the disk buffer and returns
at once; it never talks to the console. The daemon's sender forms batches and
posts them.

Disk buffer (``<state>/telemetry``):

- records are appended, one JSON line each, to segment files
  (``seg-<n>.jsonl``); the newest segment is the active one;
- the buffer is bounded by ``LOCKSTEP_TELEMETRY_BUFFER_BYTES``: beyond the
  bound the oldest segments are deleted and their records counted as dropped
  (dropping is by segment, each at most 1/16 of the bound);
- a batch (at most the console's bound, and at most a quarter of the buffer's) is
  formed from the oldest segments and written, with its ``seq`` and
  ``dropped`` count, to ``state.json`` *before* its segments are deleted; it is
  re-sent unchanged until the console accepts it (or says it already has that
  ``seq``), so a retry after a lost answer is a harmless duplicate;
- ``state.json`` (atomic) also keeps the next ``seq``, the drops not yet
  reported in a batch and the total of drops, so all of it survives restarts.

The in-flight batches count toward the bound but are never dropped.

Records of a *prompt* kind (``PROMPT_KINDS``: probe windows, which the console triangulates as
soon as a window is complete) do not wait ``linger_s``: the batch holding them is formed
``PROMPT_LINGER_S`` after the first of them, so the windows every NIC of the host emits at once
travel together, in at most one batch per ``PROMPT_LINGER_S``.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from agent import log as agentlog
from agent.state import atomic_write_json, ensure_private_dir, read_json

KIND_RE = re.compile(r"^[a-z0-9_.]{1,64}$")
_BATCH_OVERHEAD = 96  # {"seq":...,"dropped":...,"records":[]} and slack
PROMPT_KINDS = frozenset({"probe.window"})
PROMPT_LINGER_S = 0.05


class TelemetryBuffer:
    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        batch_max_bytes: int = 1048576,
        batch_max_records: int = 5000,
        linger_s: float = 2.0,
        sync: bool = True,
    ):
        self.dir = ensure_private_dir(directory)
        self.max_bytes = int(max_bytes)
        self.batch_max_bytes = int(batch_max_bytes)
        self.batch_max_records = int(batch_max_records)
        self.linger_s = linger_s
        self.sync = sync
        self.segment_max_bytes = max(512, min(256 * 1024, self.max_bytes // 16, self.batch_max_bytes // 4))
        self.segment_max_records = max(1, min(1000, self.batch_max_records))
        self.max_record_bytes = max(256, min(256 * 1024, self.batch_max_bytes // 4, self.segment_max_bytes))
        # A batch in flight is never dropped, so keep it small next to the bound.
        self.batch_budget = max(self.segment_max_bytes, min(self.batch_max_bytes, self.max_bytes // 4)) - _BATCH_OVERHEAD
        self._cond = threading.Condition()
        self._segments: list[dict] = []  # oldest first: {"n", "bytes", "records"}
        self._active_fh = None
        self._next_segment = 1
        self._unbatched_since: float | None = None
        self._prompt_since: float | None = None  # the oldest unbatched record of a prompt kind
        self._state: dict[str, Any] = {"next_seq": 1, "dropped_unreported": 0, "dropped_total": 0, "pending": []}
        self._load()

    # -- persistence ----------------------------------------------------------------------

    def _segment_path(self, n: int) -> Path:
        return self.dir / f"seg-{n:012d}.jsonl"

    def _save_state(self) -> None:
        atomic_write_json(self.dir / "state.json", self._state, sync=self.sync)

    def _load(self) -> None:
        state = read_json(self.dir / "state.json")
        if isinstance(state, dict):
            self._state.update({k: state[k] for k in self._state if k in state})
        consumed = {n for batch in self._state["pending"] for n in batch.get("segments", [])}
        found = []
        for path in self.dir.glob("seg-*.jsonl"):
            try:
                found.append(int(path.stem.split("-", 1)[1]))
            except ValueError:
                continue
        for n in sorted(found):
            path = self._segment_path(n)
            if n in consumed:  # batched before a crash, not yet deleted
                path.unlink(missing_ok=True)
                continue
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # a torn last line from a crash
                data = data[: data.rfind(b"\n") + 1]
                with open(path, "r+b") as fh:
                    fh.truncate(len(data))
            records = data.count(b"\n")
            if records == 0:
                path.unlink(missing_ok=True)
                continue
            self._segments.append({"n": n, "bytes": len(data), "records": records})
        self._next_segment = max([0, *found, *consumed]) + 1
        if self._segments:
            self._unbatched_since = 0.0  # leftovers from a previous run: send without lingering

    # -- appending ----------------------------------------------------------------------

    def emit(self, kind: str, data: dict, ts: float | str | None = None) -> None:
        """Validate and buffer one record; raises ValueError naming what is wrong."""
        if not isinstance(kind, str) or not KIND_RE.match(kind):
            raise ValueError(f"telemetry kind {kind!r} must be a dotted name ([a-z0-9_.], at most 64 characters)")
        if not isinstance(data, dict):
            raise ValueError(f"telemetry data for {kind!r} must be an object, not {type(data).__name__}")
        if ts is None:
            ts = round(time.time(), 6)
        elif isinstance(ts, bool) or not isinstance(ts, (int, float, str)):
            raise ValueError(f"telemetry ts for {kind!r} must be Unix seconds or an ISO 8601 string")
        try:
            line = json.dumps({"kind": kind, "ts": ts, "data": data}, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"telemetry data for {kind!r} is not JSON: {exc}") from None
        encoded = line.encode() + b"\n"
        if len(encoded) > self.max_record_bytes:
            raise ValueError(
                f"telemetry record {kind!r} is {len(encoded)} bytes, more than {self.max_record_bytes}; "
                "aggregate it into smaller records"
            )
        self.append_line(encoded, prompt=kind in PROMPT_KINDS)

    def append_line(self, encoded: bytes, prompt: bool = False) -> None:
        with self._cond:
            active = self._segments[-1] if self._segments and self._active_fh is not None else None
            if (
                active is None
                or active["bytes"] + len(encoded) > self.segment_max_bytes
                or active["records"] >= self.segment_max_records
            ):
                self._rotate()
                active = {"n": self._next_segment, "bytes": 0, "records": 0}
                self._next_segment += 1
                self._segments.append(active)
                self._active_fh = open(self._segment_path(active["n"]), "ab", buffering=0)  # noqa: SIM115
                os.fchmod(self._active_fh.fileno(), 0o600)
            self._active_fh.write(encoded)
            active["bytes"] += len(encoded)
            active["records"] += 1
            if self._unbatched_since is None:
                self._unbatched_since = time.monotonic()
            if prompt and self._prompt_since is None:
                self._prompt_since = time.monotonic()
            self._enforce_bound()
            self._cond.notify_all()

    def _rotate(self) -> None:
        if self._active_fh is not None:
            self._active_fh.close()
            self._active_fh = None

    def _pending_bytes(self) -> int:
        return sum(b.get("bytes", 0) for b in self._state["pending"])

    def _enforce_bound(self) -> None:
        dropped = 0
        while len(self._segments) > 1 and self._total_bytes() > self.max_bytes:
            oldest = self._segments.pop(0)
            self._segment_path(oldest["n"]).unlink(missing_ok=True)
            dropped += oldest["records"]
        if dropped:
            self._state["dropped_unreported"] += dropped
            self._state["dropped_total"] += dropped
            self._save_state()
            agentlog.warning(
                "telemetry.dropped",
                records=dropped,
                total=self._state["dropped_total"],
                bound_bytes=self.max_bytes,
                msg="telemetry buffer full; oldest records dropped",
            )

    def _total_bytes(self) -> int:
        return sum(s["bytes"] for s in self._segments) + self._pending_bytes()

    # -- batching -----------------------------------------------------------------------

    def next_batch(self, force: bool = False) -> dict | None:
        """The batch to send: the oldest in flight, or a new one from the oldest records.

        A new batch is only formed once the oldest unbatched record has waited
        ``linger_s`` (so records travel in batches), unless ``force`` or enough
        is buffered to fill half a batch.
        """
        with self._cond:
            if self._state["pending"]:
                return self._state["pending"][0]
            if not self._segments:
                return None
            buffered = sum(s["bytes"] for s in self._segments)
            records = sum(s["records"] for s in self._segments)
            ready = (
                force
                or self._unbatched_since is None
                or time.monotonic() - self._unbatched_since >= self.linger_s
                or (self._prompt_since is not None and time.monotonic() - self._prompt_since >= PROMPT_LINGER_S)
                or buffered >= self.batch_budget // 2
                or records >= self.batch_max_records // 2
            )
            if not ready:
                return None
            return self._form()

    def _form(self) -> dict | None:
        budget = self.batch_budget
        chosen: list[dict] = []
        size = count = 0
        for seg in self._segments:
            if chosen and (size + seg["bytes"] > budget or count + seg["records"] > self.batch_max_records):
                break
            chosen.append(seg)
            size += seg["bytes"]
            count += seg["records"]
        if chosen[-1] is self._segments[-1]:
            self._rotate()
        lines: list[bytes] = []
        for seg in chosen:
            lines.extend(ln for ln in self._segment_path(seg["n"]).read_bytes().splitlines() if ln)
        records = []
        for ln in lines:
            try:
                records.append(json.loads(ln))
            except ValueError:
                continue
        batches = self._chunk(records)
        for batch in batches:
            batch["seq"] = self._state["next_seq"]
            self._state["next_seq"] += 1
            batch["dropped"] = 0
        if batches:
            batches[0]["dropped"] = self._state["dropped_unreported"]
            batches[0]["segments"] = [seg["n"] for seg in chosen]
            self._state["dropped_unreported"] = 0
        self._state["pending"].extend(batches)
        self._save_state()  # the batch is safe before its records leave the segments
        for seg in chosen:
            self._segments.remove(seg)
            self._segment_path(seg["n"]).unlink(missing_ok=True)
        self._unbatched_since = time.monotonic() if self._segments else None
        if self._prompt_since is not None:  # what did not fit this batch goes promptly too
            self._prompt_since = time.monotonic() if self._segments else None
        return self._state["pending"][0] if self._state["pending"] else None

    def _chunk(self, records: list) -> list[dict]:
        budget = self.batch_budget
        batches: list[dict] = []
        current: list = []
        size = 0
        for rec in records:
            n = len(json.dumps(rec, separators=(",", ":"))) + 1
            if current and (size + n > budget or len(current) >= self.batch_max_records):
                batches.append({"records": current, "bytes": size})
                current, size = [], 0
            current.append(rec)
            size += n
        if current:
            batches.append({"records": current, "bytes": size})
        return batches

    @staticmethod
    def encode(batch: dict) -> bytes:
        body = {"seq": batch["seq"], "dropped": batch["dropped"], "records": batch["records"]}
        return json.dumps(body, separators=(",", ":")).encode()

    def ack(self, seq: int) -> None:
        """The console has the batch ``seq`` (accepted now, or a duplicate of one it had)."""
        with self._cond:
            pending = self._state["pending"]
            if pending and pending[0]["seq"] == seq:
                pending.pop(0)
                self._save_state()
                self._cond.notify_all()

    def split_head(self) -> bool:
        """The console refused the head batch as too large: halve it (False if it is one record)."""
        with self._cond:
            pending = self._state["pending"]
            if not pending or len(pending[0]["records"]) < 2:
                return False
            head = pending[0]
            half = len(head["records"]) // 2
            first = dict(head, records=head["records"][:half])
            second = {"records": head["records"][half:], "dropped": 0, "seq": head["seq"] + 1}
            for batch in (first, second):
                batch["bytes"] = sum(len(json.dumps(r, separators=(",", ":"))) + 1 for r in batch["records"])
            for later in pending[1:]:
                later["seq"] += 1
            pending[0:1] = [first, second]
            self._state["next_seq"] += 1
            self._save_state()
            return True

    def discard_head(self, reason: str, record_index: int | None = None) -> int:
        """Give up on the head batch (or one record of it) that the console refuses; count it dropped."""
        with self._cond:
            pending = self._state["pending"]
            if not pending:
                return 0
            head = pending[0]
            if record_index is not None and 0 <= record_index < len(head["records"]) and len(head["records"]) > 1:
                head["records"].pop(record_index)
                n = 1
            else:
                pending.pop(0)
                n = len(head["records"])
                if head.get("dropped"):
                    self._state["dropped_unreported"] += head["dropped"]
            self._state["dropped_unreported"] += n
            self._state["dropped_total"] += n
            self._save_state()
            agentlog.warning("telemetry.discarded", records=n, reason=reason)
            return n

    def wait(self, timeout: float) -> None:
        """Sleep until a record arrives or ``timeout`` passes."""
        with self._cond:
            self._cond.wait(timeout)

    def due_in(self, longest: float) -> float:
        """Seconds until the unbatched records are due to be sent (at most `longest`)."""
        with self._cond:
            now, due = time.monotonic(), longest
            if self._unbatched_since is not None:
                due = min(due, self._unbatched_since + self.linger_s - now)
            if self._prompt_since is not None:
                due = min(due, self._prompt_since + PROMPT_LINGER_S - now)
            return max(0.0, due)

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def stats(self) -> dict:
        with self._cond:
            return {
                "buffered": sum(s["records"] for s in self._segments)
                + sum(len(b["records"]) for b in self._state["pending"]),
                "bytes": self._total_bytes(),
                "dropped_total": self._state["dropped_total"],
                "dropped_unreported": self._state["dropped_unreported"],
                "next_seq": self._state["next_seq"],
                "pending_batches": len(self._state["pending"]),
            }

    def close(self) -> None:
        with self._cond:
            self._rotate()


_sink: TelemetryBuffer | None = None
_sink_lock = threading.Lock()


def set_sink(buffer: TelemetryBuffer | None) -> None:
    """The daemon routes :func:`emit` to its buffer (None detaches it)."""
    global _sink
    with _sink_lock:
        _sink = buffer


def emit(kind: str, data: dict, ts: float | str | None = None) -> None:
    """Buffer one telemetry record for the console (through the running daemon).

    Raises ValueError for a bad record and RuntimeError when no daemon runs in
    this process.
    """
    sink = _sink
    if sink is None:
        raise RuntimeError("no Lockstep agent daemon is running in this process; telemetry goes through the daemon")
    sink.emit(kind, data, ts)
