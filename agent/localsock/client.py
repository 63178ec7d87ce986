"""A sender for the Lockstep agent's local socket (stdlib only, no other import from the agent).

For processes on a node (the training runtime, tools, tests). It never blocks its caller and
never raises for a missing or busy agent: an event that cannot be written at once is dropped
and counted. The protocol is in docs/agent-protocol.md ("Local socket"); this file is meant
to be copied or loaded by path as well as imported, so it stands alone.

    from agent.localsock.client import AgentSocket
    sock = AgentSocket()                       # $LOCKSTEP_AGENT_SOCKET or /run/lockstep/agent.sock
    sock.event("job.heartbeat", {"job": "j-42", "step": 1200})   # True when written
    answer = sock.time()                       # {"cluster_time_ns": ..., "synced": False, ...} or None
    sock.dropped                               # events not written (no agent, socket full, too long)

Not thread-safe: give each thread its own ``AgentSocket`` (they are cheap), or guard one with a lock.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import time

DEFAULT_PATH = "/run/lockstep/agent.sock"
LINE_MAX = 64 * 1024
_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_SUN_PATH_MAX = 107


def socket_path() -> str:
    return os.environ.get("LOCKSTEP_AGENT_SOCKET") or DEFAULT_PATH


class AgentSocket:
    def __init__(self, path: str | None = None, reconnect_every_s: float = 1.0):
        self.path = path or socket_path()
        self.reconnect_every_s = reconnect_every_s
        self.sent = 0
        self.dropped = 0
        self._sock: socket.socket | None = None
        self._next_try = 0.0
        self._next_id = 0
        self._pending = b""  # bytes read past a reply we were looking for

    # -- connection ---------------------------------------------------------------------

    def _connect(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        now = time.monotonic()
        if now < self._next_try:
            return None  # no agent a moment ago: do not try on every event
        self._next_try = now + self.reconnect_every_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        dirfd = None
        try:
            address = self.path
            if len(address.encode()) > _SUN_PATH_MAX:  # sun_path is 108 bytes: go through the directory
                dirfd = os.open(os.path.dirname(address) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                address = f"/proc/self/fd/{dirfd}/{os.path.basename(address)}"
            sock.connect(address)
        except OSError:  # no agent (ENOENT, ECONNREFUSED), no permission, backlog full (EAGAIN)
            sock.close()
            return None
        finally:
            if dirfd is not None:
                os.close(dirfd)
        self._sock = sock
        self._pending = b""
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> AgentSocket:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _write(self, line: bytes) -> bool:
        sock = self._connect()
        if sock is None:
            return False
        try:
            n = sock.send(line, _FLAGS)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.close()  # the agent went away: reconnect on a later call
            return False
        if n != len(line):
            # Half a line is in the stream: close so the agent discards it, rather than glue the
            # next message onto it.
            self.close()
            return False
        return True

    # -- messages -----------------------------------------------------------------------

    def event(self, kind: str, data: dict | None = None, ts_ns: int | None = None) -> bool:
        """Send one event; True when written, False when dropped (counted in ``dropped``)."""
        body = {"v": 1, "op": "event", "kind": kind, "ts_ns": time.time_ns() if ts_ns is None else ts_ns,
                "data": data or {}}
        try:
            line = json.dumps(body, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError):
            self.dropped += 1
            return False
        if len(line) > LINE_MAX or not self._write(line):
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def time(self, timeout: float = 0.05) -> dict | None:
        """The cluster time (the reply without ``v``/``id``/``ok``), or None when there is no
        answer within ``timeout`` seconds."""
        self._next_id += 1
        mid = self._next_id
        line = json.dumps({"v": 1, "op": "time", "id": mid}).encode() + b"\n"
        if not self._write(line):
            return None
        reply = self._read_reply(mid, time.monotonic() + timeout)
        if reply is None or not reply.get("ok"):
            return None
        return {k: v for k, v in reply.items() if k not in ("v", "id", "ok")}

    def _read_reply(self, mid: int, deadline: float) -> dict | None:
        sock = self._sock
        while sock is not None:
            while b"\n" in self._pending:
                raw, self._pending = self._pending.split(b"\n", 1)
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.get("id") == mid:
                    return msg
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([sock], [], [], remaining)
            if not ready:
                return None
            try:
                chunk = sock.recv(LINE_MAX)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return None
            self._pending += chunk
        return None
