"""Persistent record of commands: which ran, with what result, and whether the console has it.

Delivery is at least once (protocol §3). A command id that comes back after it
completed is never run again: its stored result is posted again instead. A
command that was executing when the agent died is finished on the next start
as ``failed`` ("the agent stopped while it was running"), not run a second time.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path

from agent.state import StateError, atomic_write_json, ensure_private_dir, read_json

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RETENTION_S = 7 * 24 * 3600


def valid_id(command_id: object) -> bool:
    return isinstance(command_id, str) and bool(ID_RE.match(command_id))


class CommandStore:
    def __init__(self, directory: Path, sync: bool = True):
        self.dir = ensure_private_dir(directory)
        self.sync = sync
        self._lock = threading.RLock()

    def _done_path(self, cid: str) -> Path:
        return self.dir / f"{cid}.json"

    def _running_path(self, cid: str) -> Path:
        return self.dir / f"{cid}.running"

    def completed(self, cid: str) -> dict | None:
        try:
            record = read_json(self._done_path(cid))
        except StateError:
            return None
        return record if isinstance(record, dict) else None

    def is_running(self, cid: str) -> bool:
        return self._running_path(cid).exists()

    def mark_running(self, cid: str, ctype: str, attempt: int) -> None:
        record = {"id": cid, "type": ctype, "attempt": attempt, "started_at": time.time()}
        atomic_write_json(self._running_path(cid), record, sync=self.sync)

    def complete(self, cid: str, ctype: str, status: str, result: object, error: str) -> dict | None:
        """Store the outcome once; a second outcome for the same id is ignored (returns None)."""
        with self._lock:
            if self._done_path(cid).exists():
                return None
            record = {
                "id": cid,
                "type": ctype,
                "status": status,
                "result": result,
                "error": error,
                "completed_at": time.time(),
                "posted": False,
            }
            atomic_write_json(self._done_path(cid), record, sync=self.sync)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._running_path(cid))
            return record

    def replace_outcome(self, cid: str, status: str, result: object, error: str) -> None:
        """Used when the console refuses a result as too large: store what is posted instead."""
        with self._lock:
            record = self.completed(cid)
            if record is None:
                return
            record.update(status=status, result=result, error=error, posted=False)
            atomic_write_json(self._done_path(cid), record, sync=self.sync)

    def mark_posted(self, cid: str) -> None:
        with self._lock:
            record = self.completed(cid)
            if record is None or record.get("posted"):
                return
            record["posted"] = True
            record["posted_at"] = time.time()
            atomic_write_json(self._done_path(cid), record, sync=self.sync)

    def unposted(self) -> list[dict]:
        records = []
        for path in self.dir.glob("*.json"):
            cid = path.name[: -len(".json")]
            record = self.completed(cid)
            if record is not None and not record.get("posted"):
                records.append(record)
        records.sort(key=lambda r: r.get("completed_at", 0))
        return records

    def recover(self) -> list[str]:
        """Finish commands that were executing when the agent stopped; returns their ids."""
        recovered = []
        for path in sorted(self.dir.glob("*.running")):
            cid = path.name[: -len(".running")]
            try:
                marker = read_json(path) or {}
            except StateError:
                marker = {}
            if not isinstance(marker, dict):
                marker = {}
            if self.complete(
                cid,
                str(marker.get("type", "")),
                "failed",
                None,
                "The agent stopped while this command was running; it was not run again. "
                "Issue the command again if it is still needed.",
            ) is not None:
                recovered.append(cid)
            else:
                path.unlink(missing_ok=True)
        return recovered

    def prune(self, retention_s: float = RETENTION_S) -> int:
        """Forget posted results older than ``retention_s`` (far longer than any redelivery)."""
        cutoff = time.time() - retention_s
        removed = 0
        for path in self.dir.glob("*.json"):
            record = self.completed(path.name[: -len(".json")])
            if record and record.get("posted") and record.get("completed_at", 0) < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        for path in self.dir.glob(".*.tmp"):
            if path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
        return removed
