"""A protocol-faithful fake of the console's agent endpoints (docs/agent-protocol.md).

This is a FAKE, for the agent's tests, while the real endpoints are being
written. It is a real HTTP server on 127.0.0.1 (a thread), and it implements
the document: enrollment with every refusal, node credentials (401/403),
heartbeats, long-poll with claim, lease (``timeout_s + lease_extra_s``) and
redelivery (``attempt`` + 1, at most 3, then ``expired``), results accepted once
(404 for another node's command, 413 above the batch bound), telemetry with
``(node, seq)`` dedup, the drop counter, bounds (413) and validation (400 naming
the first bad field), and the inventory PUT.

Test controls beyond the protocol: ``stop()``/``start()`` (the console goes
away: listening socket closed, open long polls cut; then comes back on the same
port), ``inject(...)`` (drop a connection before or after handling, or answer
with a status), and inspection helpers. The daemon tests use it through the
``console`` fixture, whose interface (see ``conftest.py``) a real-console
adapter can implement later.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/api/v1/agent"
TOKEN_RE = re.compile(r"^lse_([A-Za-z0-9]{12})\.(.+)$")
CRED_RE = re.compile(r"^lsn_([A-Za-z0-9]{12})\.(.+)$")
KIND_RE = re.compile(r"^[a-z0-9_.]{1,64}$")
ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
MAX_INVENTORY_BYTES = 2 * 1024 * 1024
MAX_POLL_WAIT = 30


def _key() -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Token:
    key: str
    secret: str
    cluster_id: int
    expires_at: float | None = None
    revoked: bool = False
    max_uses: int | None = None
    uses: int = 0

    @property
    def text(self) -> str:
        return f"lse_{self.key}.{self.secret}"


@dataclass
class Node:
    id: int
    name: str
    cluster_id: int
    machine_id: str = ""
    state: str = "enrolling"
    credential: str = ""
    host: dict = field(default_factory=dict)


@dataclass
class Command:
    id: str
    node_id: int
    type: str
    args: dict
    timeout_s: float
    issued_at: str
    state: str = "queued"  # queued, claimed, succeeded, failed, expired
    attempt: int = 0
    lease_until: float = 0.0
    deliveries: int = 0
    status: str = ""
    result: Any = None
    error: str = ""
    result_posts: int = 0


class FakeConsole:
    ORGANIZATION_ID = 3

    def __init__(
        self,
        heartbeat_interval_s: float = 1,
        poll_wait_s: float = 2,
        max_batch_bytes: int = 1048576,
        max_records: int = 5000,
        lease_extra_s: float = 30,
        max_attempts: int = 3,
        clusters: tuple[int, ...] = (7, 8),
    ):
        self.heartbeat_interval_s = heartbeat_interval_s
        self.poll_wait_s = poll_wait_s
        self.max_batch_bytes = max_batch_bytes
        self.max_records = max_records
        self.lease_extra_s = lease_extra_s
        self.max_attempts = max_attempts
        self.clusters = set(clusters)
        self.cond = threading.Condition()
        self.tokens: dict[str, Token] = {}
        self.nodes: dict[int, Node] = {}
        self.credentials: dict[str, int] = {}
        self.commands: dict[str, Command] = {}
        self.order: list[str] = []
        self.batches: dict[int, dict[int, dict]] = {}
        self.records: dict[int, list[dict]] = {}
        self.drop_counter: dict[int, int] = {}
        self.duplicates: dict[int, int] = {}
        self.heartbeat_log: dict[int, list[dict]] = {}
        self.inventories: dict[int, list[dict]] = {}
        self.request_log: list[tuple[float, str, str, int]] = []
        self.faults: list[dict] = []
        self.available = False
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._next_node = 41

    # -- server lifecycle ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeConsole:
        """Listen (again, on the same port after a stop)."""
        handler = _make_handler(self)
        deadline = time.monotonic() + 10
        while True:
            try:
                server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        with self.cond:
            self.available = True
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The console goes away: no new connections, open long polls are cut."""
        with self.cond:
            self.available = False
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    close = stop

    # -- test controls ------------------------------------------------------------------

    def create_token(
        self, cluster_id: int = 7, expires_in_s: float | None = 3600, max_uses: int | None = None
    ) -> str:
        token = Token(_key(), secrets.token_urlsafe(24), cluster_id, max_uses=max_uses,
                      expires_at=None if expires_in_s is None else time.time() + expires_in_s)
        with self.cond:
            self.tokens[token.key] = token
        return token.text

    def revoke_token(self, text: str) -> None:
        with self.cond:
            self.tokens[TOKEN_RE.match(text).group(1)].revoked = True

    def expire_token(self, text: str) -> None:
        with self.cond:
            self.tokens[TOKEN_RE.match(text).group(1)].expires_at = time.time() - 1

    def add_node(self, cluster_id: int, hostname: str, machine_id: str = "", state: str = "ready") -> int:
        """A node the operator created (imported topology), or one enrolled from another machine."""
        with self.cond:
            node = Node(self._new_node_id(), hostname, cluster_id, machine_id=machine_id, state=state)
            self.nodes[node.id] = node
            return node.id

    def revoke_credential(self, node_id: int) -> None:
        with self.cond:
            node = self.nodes[node_id]
            self.credentials.pop(node.credential, None)

    def retire(self, node_id: int) -> None:
        with self.cond:
            self.nodes[node_id].state = "retired"

    def enqueue(self, node_id: int, ctype: str, args: dict | None = None, timeout_s: float = 60) -> str:
        cmd = Command(str(uuid.uuid4()), node_id, ctype, dict(args or {}), timeout_s, _now_iso())
        with self.cond:
            self.commands[cmd.id] = cmd
            self.order.append(cmd.id)
            self.cond.notify_all()
        return cmd.id

    def redeliver(self, command_id: str) -> None:
        """Offer a claimed command again now, as if its lease had run out."""
        with self.cond:
            cmd = self.commands[command_id]
            cmd.lease_until = 0.0
            self._expire_leases(time.monotonic())
            self.cond.notify_all()

    def inject(self, path_regex: str, mode: str | int, times: int = 1, method: str | None = None,
               retry_after: int | None = None) -> None:
        """Next ``times`` requests matching: ``"drop_before"``, ``"drop_after"`` or a status code
        (with a ``Retry-After`` header when ``retry_after`` is given)."""
        with self.cond:
            self.faults.append({"re": re.compile(path_regex), "mode": mode, "times": times, "method": method,
                                "retry_after": retry_after})

    def clear_faults(self) -> None:
        with self.cond:
            self.faults.clear()

    def command(self, command_id: str) -> Command:
        with self.cond:
            return self.commands[command_id]

    def telemetry_records(self, node_id: int) -> list[dict]:
        with self.cond:
            return list(self.records.get(node_id, []))

    def telemetry_batches(self, node_id: int) -> list[dict]:
        with self.cond:
            return [self.batches[node_id][s] for s in sorted(self.batches.get(node_id, {}))]

    def dropped(self, node_id: int) -> int:
        with self.cond:
            return self.drop_counter.get(node_id, 0)

    def heartbeats(self, node_id: int) -> list[dict]:
        with self.cond:
            return list(self.heartbeat_log.get(node_id, []))

    def inventory(self, node_id: int) -> dict | None:
        with self.cond:
            docs = self.inventories.get(node_id)
            return docs[-1] if docs else None

    def node(self, node_id: int) -> Node:
        with self.cond:
            return self.nodes[node_id]

    def node_by_name(self, name: str) -> Node | None:
        with self.cond:
            return next((n for n in self.nodes.values() if n.name == name), None)

    def requests(self, path_regex: str = "") -> list[tuple[float, str, str, int]]:
        rx = re.compile(path_regex)
        with self.cond:
            return [r for r in self.request_log if rx.search(r[2])]

    # -- protocol logic (called with self.cond held unless noted) -----------------------

    def _new_node_id(self) -> int:
        self._next_node += 1
        return self._next_node

    def _authenticate(self, header: str | None) -> tuple[Node | None, tuple[int, dict] | None]:
        if not header or not header.startswith("Bearer "):
            return None, (401, {"error": "node_credential_invalid", "detail": "Missing node credential."})
        node_id = self.credentials.get(header[len("Bearer ") :].strip())
        if node_id is None:
            return None, (401, {"error": "node_credential_invalid", "detail": "Unknown or revoked credential."})
        node = self.nodes[node_id]
        if node.state == "retired":
            return None, (403, {"error": "node_retired", "detail": "This node is retired."})
        if node.state in ("enrolling", "lost"):
            node.state = "ready"
        return node, None

    def _enroll(self, body: Any) -> tuple[int, dict]:
        if not isinstance(body, dict) or not isinstance(body.get("token"), str):
            return 400, {"error": "invalid", "detail": "token is required.", "fields": {"token": "required"}}
        match = TOKEN_RE.match(body["token"])
        token = self.tokens.get(match.group(1)) if match else None
        if token is None or not secrets.compare_digest(token.secret, match.group(2)):
            return 401, {"error": "enrollment_token_invalid", "detail": "Unknown or malformed enrollment token."}
        if token.revoked:
            return 401, {"error": "enrollment_token_revoked", "detail": "This enrollment token was revoked."}
        if token.expires_at is not None and token.expires_at < time.time():
            return 401, {"error": "enrollment_token_expired", "detail": "This enrollment token has expired."}
        if token.max_uses is not None and token.uses >= token.max_uses:
            return 401, {"error": "enrollment_token_exhausted", "detail": "This enrollment token is used up."}
        cluster_id = body.get("cluster_id")
        if cluster_id is not None and cluster_id != token.cluster_id:
            return 403, {"error": "enrollment_token_wrong_cluster", "detail": "The token is for another cluster."}
        host = body.get("host")
        if not isinstance(host, dict):
            return 400, {"error": "invalid", "detail": "host is required.", "fields": {"host": "required"}}
        for name in ("hostname", "machine_id"):
            if not isinstance(host.get(name), str) or not host[name]:
                return 400, {"error": "invalid", "detail": f"host.{name} is required.", "fields": {f"host.{name}": "required"}}
        in_cluster = [n for n in self.nodes.values() if n.cluster_id == token.cluster_id]
        node = next((n for n in in_cluster if n.machine_id == host["machine_id"]), None)
        if node is None:
            node = next((n for n in in_cluster if n.name == host["hostname"]), None)
            if node is not None and node.machine_id and node.state != "retired":
                return 409, {"error": "hostname_taken", "detail": "Another machine has this host name."}
        if node is None:
            node = Node(self._new_node_id(), host["hostname"], token.cluster_id)
            self.nodes[node.id] = node
        self.credentials.pop(node.credential, None)
        node.machine_id = host["machine_id"]
        node.name = host["hostname"]
        node.host = host
        node.state = "enrolling"
        node.credential = f"lsn_{_key()}.{secrets.token_urlsafe(24)}"
        self.credentials[node.credential] = node.id
        token.uses += 1
        return 201, {
            "node_id": node.id,
            "node_name": node.name,
            "cluster_id": node.cluster_id,
            "organization_id": self.ORGANIZATION_ID,
            "credential": node.credential,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "poll_wait_s": self.poll_wait_s,
            "telemetry_max_batch_bytes": self.max_batch_bytes,
            "telemetry_max_records": self.max_records,
        }

    def _expire_leases(self, now: float) -> None:
        for cmd in self.commands.values():
            if cmd.state == "claimed" and cmd.lease_until <= now:
                cmd.state = "queued" if cmd.attempt < self.max_attempts else "expired"

    def _claim(self, node: Node, limit: int) -> list[dict]:
        now = time.monotonic()
        self._expire_leases(now)
        out = []
        for cid in self.order:
            cmd = self.commands[cid]
            if cmd.node_id != node.id or cmd.state != "queued":
                continue
            cmd.state = "claimed"
            cmd.attempt += 1
            cmd.deliveries += 1
            cmd.lease_until = now + cmd.timeout_s + self.lease_extra_s
            out.append({"id": cmd.id, "type": cmd.type, "args": cmd.args, "timeout_s": cmd.timeout_s,
                        "attempt": cmd.attempt, "issued_at": cmd.issued_at})
            if len(out) >= limit:
                break
        return out

    def _result(self, node: Node, cid: str, body: Any, size: int) -> tuple[int, dict]:
        cmd = self.commands.get(cid)
        if cmd is None or cmd.node_id != node.id:
            return 404, {"error": "not_found", "detail": "No such command for this node."}
        if size > self.max_batch_bytes:
            return 413, {"error": "result_too_large", "detail": "The result is larger than the batch bound."}
        if not isinstance(body, dict) or body.get("status") not in ("succeeded", "failed"):
            return 400, {"error": "invalid", "detail": "status must be succeeded or failed.", "fields": {"status": "invalid"}}
        if body["status"] == "failed" and not isinstance(body.get("error"), str):
            return 400, {"error": "invalid", "detail": "a failed result carries an error.", "fields": {"error": "required"}}
        cmd.result_posts += 1
        if cmd.state in ("succeeded", "failed"):
            return 200, {"accepted": False, "reason": "already completed"}
        cmd.state = body["status"]
        cmd.status = body["status"]
        cmd.result = body.get("result")
        cmd.error = body.get("error") or ""
        return 200, {"accepted": True}

    def _telemetry(self, node: Node, body: Any, size: int) -> tuple[int, dict]:
        if size > self.max_batch_bytes:
            return 413, {"error": "batch_too_large", "detail": "The batch is larger than the bound."}
        if not isinstance(body, dict):
            return 400, {"error": "invalid", "detail": "the batch must be an object.", "fields": {"": "invalid"}}
        seq = body.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            return 400, {"error": "invalid", "detail": "seq must be an integer >= 1.", "fields": {"seq": "invalid"}}
        dropped = body.get("dropped", 0)
        if not isinstance(dropped, int) or isinstance(dropped, bool) or dropped < 0:
            return 400, {"error": "invalid", "detail": "dropped must be >= 0.", "fields": {"dropped": "invalid"}}
        records = body.get("records")
        if not isinstance(records, list):
            return 400, {"error": "invalid", "detail": "records must be a list.", "fields": {"records": "invalid"}}
        if len(records) > self.max_records:
            return 413, {"error": "batch_too_large", "detail": "Too many records."}
        for i, rec in enumerate(records):
            if not isinstance(rec, dict):
                return 400, {"error": "invalid", "detail": f"records[{i}] is not an object.", "fields": {f"records[{i}]": "invalid"}}
            if not isinstance(rec.get("kind"), str) or not KIND_RE.match(rec["kind"]):
                return 400, {"error": "invalid", "detail": f"records[{i}].kind is invalid.", "fields": {f"records[{i}].kind": "invalid"}}
            ts = rec.get("ts")
            ts_ok = (isinstance(ts, (int, float)) and not isinstance(ts, bool)) or (isinstance(ts, str) and ISO_RE.match(ts))
            if not ts_ok:
                return 400, {"error": "invalid", "detail": f"records[{i}].ts is invalid.", "fields": {f"records[{i}].ts": "invalid"}}
            if not isinstance(rec.get("data"), dict):
                return 400, {"error": "invalid", "detail": f"records[{i}].data is invalid.", "fields": {f"records[{i}].data": "invalid"}}
        seen = self.batches.setdefault(node.id, {})
        if seq in seen:
            self.duplicates[node.id] = self.duplicates.get(node.id, 0) + 1
            return 200, {"accepted": 0, "duplicate": True}
        seen[seq] = {"seq": seq, "dropped": dropped, "count": len(records)}
        self.records.setdefault(node.id, []).extend(records)
        self.drop_counter[node.id] = self.drop_counter.get(node.id, 0) + dropped
        return 202, {"accepted": len(records)}

    def _inventory(self, node: Node, body: Any, size: int) -> tuple[int, dict]:
        if size > MAX_INVENTORY_BYTES:
            return 413, {"error": "inventory_too_large", "detail": "The inventory is larger than 2 MiB."}
        if not isinstance(body, dict) or body.get("format") != "lockstep.inventory/v1":
            return 400, {"error": "invalid", "detail": "format must be lockstep.inventory/v1.", "fields": {"format": "invalid"}}
        for name in ("gpus", "nics", "affinity", "errors"):
            if not isinstance(body.get(name), list):
                return 400, {"error": "invalid", "detail": f"{name} must be a list.", "fields": {name: "invalid"}}
        if not isinstance(body.get("host"), dict):
            return 400, {"error": "invalid", "detail": "host must be an object.", "fields": {"host": "invalid"}}
        self.inventories.setdefault(node.id, []).append(body)
        return 200, {"gpus": len(body["gpus"]), "nics": len(body["nics"])}


class _Drop(Exception):
    pass


def _make_handler(console: FakeConsole):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        server_version = "FakeLockstepConsole/1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _fault(self) -> dict | None:
            with console.cond:
                for fault in console.faults:
                    if fault["times"] > 0 and fault["re"].search(self.path) and (
                        fault["method"] in (None, self.command)
                    ):
                        fault["times"] -= 1
                        return fault
            return None

        def _abort(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

        def _client_gone(self) -> bool:
            """The agent closed the connection (it exited): do not claim commands for nobody."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            with console.cond:
                console.request_log.append((time.time(), self.command, self.path, status))

        def _body(self) -> tuple[Any, int]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return (json.loads(raw) if raw else None), length
            except ValueError:
                return _Malformed, length

        def _handle(self) -> None:
            with console.cond:
                if not console.available:
                    self._abort()
                    return
            fault = self._fault()
            mode = fault["mode"] if fault else None
            if mode == "drop_before":
                self._abort()
                return
            if isinstance(mode, int):
                retry_after = fault["retry_after"]
                self._send(mode, {"error": "injected", "detail": f"injected {mode}"},
                           {"Retry-After": str(retry_after)} if retry_after is not None else None)
                return
            parts = urlsplit(self.path)
            path = parts.path
            if not path.startswith(PREFIX):
                self._send(404, {"error": "not_found", "detail": "no such endpoint"})
                return
            path = path[len(PREFIX) :]
            body, size = self._body() if self.command in ("POST", "PUT") else (None, 0)
            if body is _Malformed:
                self._send(400, {"error": "invalid", "detail": "body is not JSON", "fields": {"": "invalid"}})
                return
            if self.command == "POST" and path == "/enroll":
                with console.cond:
                    status, payload = console._enroll(body)
            elif self.command == "GET" and path == "/commands":
                status, payload = self._poll(parse_qs(parts.query))
                if status is None:
                    return
            else:
                with console.cond:
                    node, err = console._authenticate(self.headers.get("Authorization"))
                    if err is not None:
                        status, payload = err
                    elif self.command == "POST" and path == "/heartbeat":
                        console.heartbeat_log.setdefault(node.id, []).append(body or {})
                        status, payload = 200, {"node_state": node.state, "server_time": _now_iso()}
                    elif self.command == "POST" and (m := re.match(r"^/commands/([^/]+)/result$", path)):
                        status, payload = console._result(node, m.group(1), body, size)
                    elif self.command == "POST" and path == "/telemetry":
                        status, payload = console._telemetry(node, body, size)
                    elif self.command == "PUT" and path == "/inventory":
                        status, payload = console._inventory(node, body, size)
                    else:
                        status, payload = 404, {"error": "not_found", "detail": "no such endpoint"}
            if mode == "drop_after":
                self._abort()
                return
            self._send(status, payload)

        def _poll(self, query: dict) -> tuple[int | None, dict]:
            try:
                wait = min(MAX_POLL_WAIT, max(0.0, float(query.get("wait", ["25"])[0])))
                limit = max(1, int(query.get("max", ["10"])[0]))
            except ValueError:
                return 400, {"error": "invalid", "detail": "wait and max are numbers", "fields": {"wait": "invalid"}}
            deadline = time.monotonic() + wait
            with console.cond:
                node, err = console._authenticate(self.headers.get("Authorization"))
                if err is not None:
                    return err
                while True:
                    if not console.available or self._client_gone():
                        self._abort()
                        return None, {}
                    claimed = console._claim(node, limit)
                    remaining = deadline - time.monotonic()
                    if claimed or remaining <= 0:
                        return 200, {"commands": claimed}
                    leases = [c.lease_until for c in console.commands.values() if c.state == "claimed"]
                    next_lease = min(leases) - time.monotonic() if leases else remaining
                    console.cond.wait(max(0.01, min(remaining, next_lease, 0.5)))

        def do_GET(self) -> None:  # noqa: N802
            self._safe()

        def do_POST(self) -> None:  # noqa: N802
            self._safe()

        def do_PUT(self) -> None:  # noqa: N802
            self._safe()

        def _safe(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._handle()

    return Handler


class _Malformed:
    pass
