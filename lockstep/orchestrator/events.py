"""Events to the node's Lockstep agent over its local socket (the contract in BRIEF.md).

A Unix stream socket at ``$LOCKSTEP_AGENT_SOCKET`` (default ``/run/lockstep/agent.sock``);
newline-delimited JSON ``{"v":1,"op":"event","kind":...,"ts_ns":...,"data":{...}}``, at most
64 KiB a line. The sender never blocks: it connects non-blocking, writes with
``MSG_DONTWAIT|MSG_NOSIGNAL``, and drops (and counts) an event when no agent listens or the
socket is full; a partial write closes the connection (the next event reconnects) so the agent
never sees half a line.

Kinds emitted by the orchestrator: ``job.heartbeat`` (every ``heartbeat_s``: per-rank step and
step time, at most 256 ranks an event, so a larger job sends several, each with ``world_size``),
``job.rank_lost``, ``job.migration_started``, ``job.migration_finished``, ``job.snapshot``.
"""

from __future__ import annotations

import json
import os
import socket
import time

DEFAULT_SOCKET = "/run/lockstep/agent.sock"
# The kinds the console registers (docs/agent-protocol.md); the journal keeps others (job.failed).
AGENT_KINDS = frozenset({"job.heartbeat", "job.rank_lost", "job.migration_started", "job.migration_finished",
                         "job.snapshot"})
MAX_LINE = 64 * 1024


class AgentEvents:
    def __init__(self, path: str | None = None):
        self.path = path or os.environ.get("LOCKSTEP_AGENT_SOCKET", DEFAULT_SOCKET)
        self.sent = 0
        self.dropped = 0
        self._sock: socket.socket | None = None

    def _connect(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        self._sock = sock
        return sock

    def emit(self, kind: str, data: dict) -> bool:
        line = json.dumps({"v": 1, "op": "event", "kind": kind, "ts_ns": time.time_ns(), "data": data},
                          separators=(",", ":"), default=str).encode() + b"\n"
        if len(line) > MAX_LINE:
            self.dropped += 1
            return False
        sock = self._connect()
        if sock is None:
            self.dropped += 1
            return False
        try:
            n = sock.send(line, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
        except OSError:
            n = -1
        if n != len(line):
            self.close()
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
