"""The agent's local socket: events and cluster time for processes on the node.

Protocol (docs/agent-protocol.md, "Local socket"): a Unix stream socket, newline-delimited JSON
objects, at most :data:`LINE_MAX` bytes per line with its newline, every message
``{"v": 1, "op": ...}``. ``event`` messages are queued (never answered) and forwarded to the
console as ``event.<kind>`` telemetry; ``time`` is answered from the cluster clock; anything
else gets ``{"ok": false, "error": ...}``.

It never blocks the agent: one thread, a selector, non-blocking sockets. Every buffer is
bounded — the number of clients (:data:`MAX_CLIENTS`; the next one is told so and closed),
a line (longer: the connection is closed), the replies a client has not read
(:data:`OUT_MAX`; beyond: the connection is closed), and the event queue (full: the event is
dropped and counted). Events go to the telemetry buffer on another thread
(``agent.events``), so a slow disk never delays a ``time`` answer.

Permissions restrict who may talk to it: the directory is created 0750, the socket is 0660,
both group ``lockstep`` when that group exists. The socket is bound under a temporary name,
given its mode, then renamed into place, so nobody connects before the mode is right; a stale
socket of a dead agent is replaced, a live agent's is not taken over.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import grp
import json
import os
import re
import secrets
import selectors
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.clusterclock import ClusterClock

DEFAULT_PATH = "/run/lockstep/agent.sock"
GROUP = "lockstep"
LINE_MAX = 64 * 1024  # bytes per line, its newline included
MAX_CLIENTS = 64
OUT_MAX = 64 * 1024  # unread replies kept per client
KIND_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)*$")
KIND_MAX = 58  # "event." + kind fits the telemetry kind bound (64)
TS_NS_MIN, TS_NS_MAX = 946684800 * 10**9, 4102444800 * 10**9  # 2000..2100, what the console accepts
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_SUN_PATH_MAX = 107


class EventQueue:
    """Bounded (count and bytes) hand-off of events from the socket thread to the forwarder."""

    def __init__(self, max_events: int = 10000, max_bytes: int = 8 * 1024 * 1024):
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._items: collections.deque = collections.deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self.dropped = 0
        self.queued = 0

    def put(self, kind: str, ts: float, data: dict, size: int) -> bool:
        with self._cond:
            if len(self._items) >= self.max_events or self._bytes + size > self.max_bytes:
                self.dropped += 1
                return False
            self._items.append((kind, ts, data, size))
            self._bytes += size
            self.queued += 1
            self._cond.notify()
            return True

    def take(self, limit: int, timeout: float) -> list[tuple[str, float, dict]]:
        """Up to ``limit`` events, waiting up to ``timeout`` s for the first one."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            out = []
            while self._items and len(out) < limit:
                kind, ts, data, size = self._items.popleft()
                self._bytes -= size
                out.append((kind, ts, data))
            return out

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


class BadMessage(ValueError):
    pass


def parse_event(msg: dict) -> tuple[str, float, dict]:
    """(kind, ts in Unix seconds, data) of an ``event`` message, or BadMessage naming the field."""
    kind = msg.get("kind")
    if not isinstance(kind, str) or len(kind) > KIND_MAX or not KIND_RE.match(kind):
        raise BadMessage(f"kind {kind!r} is not a dotted name ([a-z0-9_] segments, at most {KIND_MAX} characters)")
    ts_ns = msg.get("ts_ns")
    if ts_ns is None:
        ts_ns = time.time_ns()
    elif isinstance(ts_ns, bool) or not isinstance(ts_ns, int) or not TS_NS_MIN <= ts_ns < TS_NS_MAX:
        raise BadMessage(f"ts_ns {ts_ns!r} is not CLOCK_REALTIME nanoseconds (an integer in 2000..2100)")
    data = msg.get("data", {})
    if not isinstance(data, dict):
        raise BadMessage(f"data must be an object, not {type(data).__name__}")
    return kind, ts_ns / 1e9, data


@dataclass
class _Client:
    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    writing: bool = False


class LocalSocketServer:
    def __init__(self, path: str | os.PathLike, events: EventQueue, clock: ClusterClock,
                 max_clients: int = MAX_CLIENTS, line_max: int = LINE_MAX, out_max: int = OUT_MAX):
        self.path = Path(path)
        self.events = events
        self.clock = clock
        self.max_clients = max_clients
        self.line_max = line_max
        self.out_max = out_max
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._dirfd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._clients: dict[int, _Client] = {}
        self.counters = collections.Counter()
        self.last_error: str | None = None

    # -- binding ------------------------------------------------------------------------

    def _address(self, name: str) -> str:
        """A bindable address for ``name`` in the socket's directory, whatever the path's length."""
        full = str(self.path.parent / name)
        if len(full.encode()) <= _SUN_PATH_MAX:
            return full
        return f"/proc/self/fd/{self._dirfd}/{name}"  # sun_path holds 108 bytes: go through the directory

    def bind(self) -> None:
        directory = self.path.parent
        gid = _group_id()
        if not directory.is_dir():
            directory.mkdir(mode=0o750, parents=True, exist_ok=True)
            os.chmod(directory, 0o750)  # noqa: S103 - owner and group lockstep, by the contract
            if gid is not None:
                os.chown(directory, -1, gid)
        self._dirfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        name = self.path.name
        try:
            st = os.stat(name, dir_fd=self._dirfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise OSError(errno.EEXIST, f"{self.path} exists and is not a socket; remove it or set "
                                            "LOCKSTEP_AGENT_SOCKET to another path")
            if _listening(self._address(name)):
                raise OSError(errno.EADDRINUSE, f"another process (an agent already running?) listens on "
                                                f"{self.path}")
        tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            listener.bind(self._address(tmp))
            os.chmod(tmp, 0o660, dir_fd=self._dirfd)
            if gid is not None:
                os.chown(tmp, -1, gid, dir_fd=self._dirfd)
            listener.listen(64)
            os.rename(tmp, name, src_dir_fd=self._dirfd, dst_dir_fd=self._dirfd)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self._dirfd)
            raise
        st = os.stat(name, dir_fd=self._dirfd, follow_symlinks=False)
        self._inode = (st.st_dev, st.st_ino)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)

    def close(self) -> None:
        for client in list(self._clients.values()):
            self._drop(client)
        if self._listener is not None:
            self._selector.unregister(self._listener)
            self._listener.close()
            self._listener = None
            # Remove the socket only if it is still ours (a newer agent may have replaced it).
            with contextlib.suppress(OSError):
                st = os.stat(self.path.name, dir_fd=self._dirfd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == self._inode:
                    os.unlink(self.path.name, dir_fd=self._dirfd)
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None
        self._selector.close()

    # -- the loop -----------------------------------------------------------------------

    def serve_once(self, timeout: float) -> None:
        """Handle what is ready within ``timeout`` seconds."""
        for key, mask in self._selector.select(timeout):
            if key.data is None:
                self._accept()
                continue
            client = key.data
            if mask & selectors.EVENT_READ:
                self._read(client)
            if mask & selectors.EVENT_WRITE and client.sock.fileno() in self._clients:
                self._flush(client)

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(self.max_clients):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: say it, keep serving those connected
                self._note("accept_failed", f"accept failed: {exc}")
                return
            if len(self._clients) >= self.max_clients:
                self.counters["refused"] += 1
                with contextlib.suppress(OSError):
                    sock.send(_reply(None, error=f"too many clients ({self.max_clients}); try again later"),
                              _SEND_FLAGS)
                sock.close()
                continue
            sock.setblocking(False)
            client = _Client(sock)
            self._clients[sock.fileno()] = client
            self._selector.register(sock, selectors.EVENT_READ, client)
            self.counters["accepted"] += 1

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(self.line_max)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(client)
            return
        if not data:  # the peer closed; an unfinished last line is dropped with it
            self._drop(client)
            return
        buf = client.inbuf
        buf += data
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            if end + 1 - start > self.line_max:
                self._too_long(client)
                return
            self._handle(client, bytes(buf[start:end]))
            start = end + 1
            if client.sock.fileno() not in self._clients:
                return  # closed while handling (a reply overflowed)
        del buf[:start]
        if len(buf) >= self.line_max:  # no newline within the bound: this line is too long
            self._too_long(client)

    def _too_long(self, client: _Client) -> None:
        self._note("too_long", f"a line longer than {self.line_max} bytes; connection closed")
        self._send(client, _reply(None, error=f"line longer than {self.line_max} bytes; connection closed"))
        self._drop(client)

    def _handle(self, client: _Client, line: bytes) -> None:
        self.counters["lines"] += 1
        try:
            msg = json.loads(line)
        except ValueError as exc:
            self._note("bad_lines", f"a line that is not JSON: {exc}")
            self._send(client, _reply(None, error=f"not a JSON object: {exc}"))
            return
        if not isinstance(msg, dict):
            self._note("bad_lines", "a line that is not a JSON object")
            self._send(client, _reply(None, error="not a JSON object"))
            return
        op = msg.get("op")
        mid = msg.get("id") if isinstance(msg.get("id"), int) and not isinstance(msg.get("id"), bool) else None
        if msg.get("v") != 1:
            self._note("bad_lines", f"protocol version {msg.get('v')!r}")
            self._send(client, _reply(mid, error=f"unsupported protocol version {msg.get('v')!r}; this agent speaks v 1"))
            return
        if op == "event":
            try:
                kind, ts, data = parse_event(msg)
            except BadMessage as exc:  # events are never answered: count it, show it in the health
                self._note("bad_events", f"event refused: {exc}")
                return
            if self.events.put(kind, ts, data, len(line)):
                self.counters["events"] += 1
            else:
                self.counters["events_dropped"] += 1
            return
        if op == "time":
            self.counters["time_requests"] += 1
            self._send(client, _reply(mid, **self.clock.now().answer()))
            return
        self._note("bad_lines", f"unknown op {op!r}")
        self._send(client, _reply(mid, error=f"unknown op {op!r}"))

    def _send(self, client: _Client, data: bytes) -> None:
        if len(client.outbuf) + len(data) > self.out_max:
            self._note("slow_closed", f"a client left more than {self.out_max} bytes of replies unread; closed")
            self._drop(client)
            return
        client.outbuf += data
        self._flush(client)

    def _flush(self, client: _Client) -> None:
        try:
            sent = client.sock.send(client.outbuf, _SEND_FLAGS) if client.outbuf else 0
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(client)
            return
        del client.outbuf[:sent]
        want_write = bool(client.outbuf)
        if want_write != client.writing:
            client.writing = want_write
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0)
            self._selector.modify(client.sock, events, client)

    def _drop(self, client: _Client) -> None:
        fd = client.sock.fileno()
        if self._clients.pop(fd, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(client.sock)
        client.sock.close()

    def _note(self, counter: str, error: str) -> None:
        self.counters[counter] += 1
        self.last_error = error[:200]

    def stats(self) -> dict:
        out = {k: self.counters[k] for k in ("accepted", "refused", "lines", "events", "events_dropped",
                                              "time_requests", "bad_lines", "bad_events", "too_long", "slow_closed")}
        out["clients"] = len(self._clients)
        if self.last_error:
            out["last_error"] = self.last_error
        return out


def _reply(mid: int | None, error: str | None = None, **fields: object) -> bytes:
    body: dict[str, object] = {"v": 1, "id": mid, "ok": error is None}
    if error is not None:
        body["error"] = error
    body.update(fields)
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _group_id() -> int | None:
    try:
        return grp.getgrnam(GROUP).gr_gid
    except KeyError:
        return None


def _listening(address: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect(address)
        return True
    except OSError:
        return False
    finally:
        probe.close()
