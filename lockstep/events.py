"""Events to the node's Lockstep agent over its local socket: the one sender the orchestrator
(``job.*``), the capture worker (``job.checkpoint``, ``job.snapshot``) and the weight leader
(``weights.version``) share.

The agent's local socket contract (docs/agent-protocol.md): a Unix stream socket at
``$LOCKSTEP_AGENT_SOCKET`` (default ``/run/lockstep/agent.sock``), newline-delimited JSON
``{"v":1,"op":"event","kind":...,"ts_ns":...,"data":{...}}``, at most 64 KiB a line. A sender
never blocks the process it serves: it connects non-blocking, writes with
``MSG_DONTWAIT|MSG_NOSIGNAL``, and drops (and counts) an event when no agent listens or the
socket is full; a partial write closes the connection (the next event reconnects) so the agent
never sees half a line.
"""

from __future__ import annotations

import json
import os
import socket
import time

DEFAULT_SOCKET = "/run/lockstep/agent.sock"
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
        line = json.dumps(
            {"v": 1, "op": "event", "kind": kind, "ts_ns": time.time_ns(), "data": data},
            separators=(",", ":"),
            default=str,
        ).encode() + b"\n"
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
            # A partial line would corrupt the stream: start over on a fresh connection.
            self.close()
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
