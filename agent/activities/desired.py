"""The desired state of the activities, kept in ``<state dir>/activities.json``.

What ``activity.set`` commands asked for, per activity: ``{"state": "running" | "stopped",
"args": {...}, "revision": int, "set_at": unix seconds}``. Written atomically on every change,
read at start, so a restarted agent runs what the console last asked for without being told
again. Entries of activities this agent does not know (a module no longer loaded) are kept:
they apply again when the module comes back.
"""

from __future__ import annotations

import threading
from pathlib import Path

from agent.state import StateError, atomic_write_json, read_json

FILE_NAME = "activities.json"
FORMAT = 1


class DesiredState:
    def __init__(self, path: Path | None, sync: bool = True):
        self.path = path  # None: in memory only (tests, tools)
        self.sync = sync
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self.load_error: str | None = None
        if path is not None:
            self._load()

    @classmethod
    def in_state_dir(cls, state_dir: Path) -> DesiredState:
        return cls(Path(state_dir) / FILE_NAME)

    def _load(self) -> None:
        assert self.path is not None
        try:
            data = read_json(self.path)
        except StateError as exc:
            # A damaged file must not keep the agent from starting: start from the defaults, say why,
            # and keep the damaged file aside for a look.
            self.load_error = str(exc)
            self.path.replace(self.path.with_name(self.path.name + ".damaged"))
            return
        if not isinstance(data, dict) or not isinstance(data.get("activities"), dict):
            return
        for name, entry in data["activities"].items():
            if (isinstance(name, str) and isinstance(entry, dict) and entry.get("state") in ("running", "stopped")
                    and isinstance(entry.get("args", {}), dict)):
                self._entries[name] = {
                    "state": entry["state"],
                    "args": dict(entry.get("args", {})),
                    "revision": entry.get("revision") if isinstance(entry.get("revision"), int) else None,
                    "set_at": entry.get("set_at"),
                }

    def get(self, name: str) -> dict | None:
        with self._lock:
            entry = self._entries.get(name)
            return dict(entry) if entry is not None else None

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def put(self, name: str, entry: dict) -> None:
        with self._lock:
            self._entries[name] = dict(entry)
            if self.path is not None:
                atomic_write_json(self.path, {"format": FORMAT, "activities": self._entries}, sync=self.sync)
