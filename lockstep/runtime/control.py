"""The rank's connection to its job's orchestrator (a thread; the training loop never waits on it).

One TCP connection, newline-delimited JSON both ways, reconnected (with a fresh ``hello``) if the
orchestrator restarts. The rank sends ``hello``, ``heartbeat`` (step, step time; every
``LOCKSTEP_HEARTBEAT_S``), ``group_error`` (a collective failed: a peer is gone), ``report``
(its collective progress, when asked to ``freeze``), ``holding`` (parked at a boundary),
``rebuilt``, ``unprotected`` / ``diverged``, and as a replacement ``ff_progress``, ``resumed``,
``resynced``, ``live``. It obeys ``freeze``, ``rebuild``, ``hold`` / ``release``, ``plan``
(replacements), ``fail`` (the job cannot recover: waiting collectives raise),
``snapshot_prepare`` (answered ``snapshot_prepared``) and ``snapshot`` (capture while holding).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

from lockstep.runtime import transfer

HEARTBEAT_S = float(os.environ.get("LOCKSTEP_HEARTBEAT_S", "1.0"))


class Controller:
    def __init__(self, rt, addr: str, token: str, incarnation: str):
        self.rt = rt
        self.addr = addr
        self.token = token
        self.incarnation = incarnation
        self.server = transfer.StateServer(rt, token)
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._connected = threading.Event()
        self._pending: list[bytes] = []
        self.plan = None
        threading.Thread(target=self._run, name="lockstep-control", daemon=True).start()
        threading.Thread(target=self._heartbeat, name="lockstep-heartbeat", daemon=True).start()

    # -- sending ---------------------------------------------------------------------------

    def send(self, msg: dict):
        line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:
            if self._sock is None:
                if len(self._pending) < 1000:
                    self._pending.append(line)
                return
            try:
                self._sock.sendall(line)
            except OSError:
                self._pending.append(line)
                self._drop_connection()

    def _drop_connection(self):
        sock, self._sock = self._sock, None
        self._connected.clear()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def _hello(self, sock: socket.socket) -> dict:
        rt = self.rt
        ip = sock.getsockname()[0]
        return {"op": "hello", "token": self.token, "role": rt.role, "rank": rt.rank, "pid": os.getpid(),
                "host": socket.gethostname(), "state_addr": f"{ip}:{self.server.port}",
                "generation": rt.generation, "incarnation": self.incarnation, "step": rt.step_no,
                "phase": rt.phase, "local_rank": rt.local_rank}

    # -- receiving -------------------------------------------------------------------------

    def _address(self) -> str:
        """Where the orchestrator is now: the node's supervisor rewrites the file when it moves."""
        if self.rt.node_dir:
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    open(os.path.join(self.rt.node_dir, "orchestrator.json")) as f:
                return json.load(f)["addr"]
        return self.addr

    def _run(self):
        while True:
            host, port = self._address().rsplit(":", 1)
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                time.sleep(0.2)
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._send_lock:
                try:
                    sock.sendall(json.dumps(self._hello(sock)).encode() + b"\n")
                    for line in self._pending:
                        sock.sendall(line)
                    self._pending = []
                except OSError:
                    sock.close()
                    continue
                self._sock = sock
                self._connected.set()
            buf = bytearray()
            try:
                while True:
                    line = transfer.recv_line(sock, buf)
                    if line:
                        self._dispatch(json.loads(line))
            except (ConnectionError, OSError, ValueError):
                pass
            with self._send_lock:
                if self._sock is sock:
                    self._drop_connection()
            time.sleep(0.1)

    def _heartbeat(self):
        rt = self.rt
        while True:
            time.sleep(HEARTBEAT_S)
            self.send({"op": "heartbeat", "step": rt.step_no, "step_time_s": round(rt.step_time_s, 6),
                       "phase": rt.phase, "holding": rt.holding})

    def _dispatch(self, msg: dict):
        op = msg.get("op")
        rt = self.rt
        if op == "freeze":
            reports = {gid: pg.freeze() for gid, pg in list(rt.groups.items())}
            self.send({"op": "report", "generation": msg.get("generation"), "groups": reports,
                       "step_no": rt.step_no, "holding": rt.holding})
        elif op == "rebuild":
            threading.Thread(target=self._rebuild, args=(msg,), daemon=True).start()
        elif op == "hold":
            boundary = int(msg["boundary"])
            answer = rt.request_hold(boundary, bool(msg.get("exit", False)))
            if answer == "missed":
                self.send({"op": "hold_missed", "step": rt.step_no, "boundary": boundary})
            elif answer == "holding":  # parked there from an earlier order: say so again
                self.send({"op": "holding", "boundary": boundary})
        elif op == "release":
            rt.release_hold()
        elif op == "plan":
            if rt.plan is not None:
                rt.plan.update(msg)
        elif op == "fail":
            message = msg.get("message", "the job cannot recover")
            if rt.plan is not None:
                rt.plan.update({"fail": message})
            for pg in list(rt.groups.values()):
                pg.fail(message)
            rt.release_hold()
        elif op == "ping":
            self.send({"op": "pong", "id": msg.get("id")})
        elif op == "snapshot_prepare":
            from lockstep.runtime import snapshot

            snapshot.on_prepare(rt, msg)
        elif op == "snapshot":
            from lockstep.runtime import snapshot

            snapshot.on_order(rt, msg)

    def _rebuild(self, msg: dict):
        generation = int(msg["generation"])
        if msg.get("store"):
            self.rt.store_addr = msg["store"]
        try:
            for gid, pg in list(self.rt.groups.items()):
                spec = msg.get("groups", {}).get(gid, {})
                pg.rebuild(generation, spec.get("rerun_from_seq"))
        except Exception as exc:
            self.send({"op": "rebuild_failed", "generation": generation, "error": str(exc)[:300]})
            return
        self.rt.generation = generation
        self.send({"op": "rebuilt", "generation": generation})
