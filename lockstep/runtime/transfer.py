"""Moving a rank's state between processes of one job.

Every worker runs a small TCP server (``StateServer``) on an ephemeral port that answers a
replacement's two questions:

* ``state``: "your parameters, optimizer states and boundary snapshot at step ``n``" -- the
  server waits until its rank sits at that boundary and holds the rank's next
  ``optimizer.step()`` while it streams (``Runtime.transfer_lock``);
* ``logs``: the group's logged collective results (interval 0, DDP's bucket rebuild, the
  current interval) that a replacement replaying the script needs.

A request is one JSON line carrying the job's token; the answer is one JSON line and, when it
says so, a ``torch.save`` payload read back with ``torch.load(weights_only=True)``: tensors and
plain containers only, never arbitrary pickles from the network.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import socket
import threading

import torch

MAX_HEADER = 1 << 20


def _dump(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _load(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def recv_line(sock: socket.socket, buf: bytearray) -> bytes:
    while True:
        i = buf.find(b"\n")
        if i >= 0:
            line = bytes(buf[:i])
            del buf[: i + 1]
            return line
        if len(buf) > MAX_HEADER:
            raise ConnectionError("header line too long")
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk


def recv_exact(sock: socket.socket, buf: bytearray, n: int) -> bytes:
    out = bytearray(buf[:n])
    del buf[: len(out)]
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 22))
        if not chunk:
            raise ConnectionError("connection closed")
        out += chunk
    return bytes(out)


class StateServer:
    def __init__(self, runtime, token: str, host: str = "0.0.0.0"):  # noqa: S104 (replacements on other nodes)
        self.runtime = runtime
        self.token = token
        self.sock = socket.create_server((host, 0), reuse_port=False)  # requests carry the job token
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="lockstep-state-server", daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket):
        with conn:
            buf = bytearray()
            try:
                req = json.loads(recv_line(conn, buf))
                if not hmac.compare_digest(str(req.get("token", "")), self.token):
                    self._reply(conn, {"ok": False, "error": "bad token"})
                    return
                op = req.get("op")
                if op == "state":
                    self._state(conn, int(req["boundary"]), float(req.get("timeout", 60)))
                elif op == "logs":
                    self._logs(conn, req.get("interval"))
                else:
                    self._reply(conn, {"ok": False, "error": f"unknown op {op!r}"})
            except (ConnectionError, OSError, ValueError, KeyError) as exc:
                with contextlib.suppress(OSError):
                    self._reply(conn, {"ok": False, "error": str(exc)})

    @staticmethod
    def _reply(conn, header: dict, payload: bytes = b""):
        header = dict(header, nbytes=len(payload))
        conn.sendall(json.dumps(header).encode() + b"\n" + payload)

    def _state(self, conn, boundary: int, timeout: float):
        rt = self.runtime
        if boundary < 0:  # "wherever you are": the current boundary
            with rt.transfer_lock:
                boundary = rt.step_no
        if not rt.wait_boundary(boundary, timeout):
            self._reply(conn, {"ok": False, "error": f"rank {rt.rank} is at step {rt.step_no}, not {boundary}",
                               "step_no": rt.step_no})
            return
        with rt.transfer_lock:
            if rt.step_no != boundary:
                self._reply(conn, {"ok": False, "error": f"rank {rt.rank} moved to step {rt.step_no}",
                                   "step_no": rt.step_no})
                return
            snap = rt.snapshot_at(boundary)
            payload = _dump({
                "parameters": [p.detach() for p in rt.parameters()],
                "optimizers": [o.state_dict() for o in rt.optimizers],
                "schedulers": snap["schedulers"] if snap else None,
                "param_groups": snap["param_groups"] if snap else None,
            })
        self._reply(conn, {"ok": True, "step_no": boundary, "rank": rt.rank}, payload)

    def _logs(self, conn, interval):
        rt = self.runtime
        out = {}
        for gid, pg in list(rt.groups.items()):
            with pg._lock:
                entry = {
                    "permanent": [[list(k), v] for k, v in pg.permanent_log.items()],
                    "rebuild": list(pg.rebuild_log),
                    "interval": [[list(k), v] for k, v in pg.interval_log.items()
                                 if interval is not None and k[0] == interval],
                }
            out[gid] = entry
        self._reply(conn, {"ok": True, "step_no": rt.step_no}, _dump(out))


def request(addr: str, token: str, message: dict, timeout: float = 120.0):
    """One request to a peer's state server: ``(header, payload object or None)``."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(json.dumps(dict(message, token=token)).encode() + b"\n")
        buf = bytearray()
        header = json.loads(recv_line(sock, buf))
        n = int(header.get("nbytes", 0))
        payload = _load(recv_exact(sock, buf, n)) if n else None
    return header, payload
