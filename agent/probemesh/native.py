"""The native engine: ``lockstep-probed`` (agent/probemesh/native/) as a subprocess.

The agent writes control lines to its stdin and reads JSON event lines from its stdout (the
protocol is in ``native/probed.h``). A configuration is sent whole; the helper applies it in
place, so NICs and peers that did not change keep their sockets, sequence numbers and open
windows. The helper is found at ``$LOCKSTEP_PROBED``, then ``build/probemesh/lockstep-probed``
of the checkout (``make native``), then ``lockstep-probed`` on ``PATH``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import time
from collections import deque
from pathlib import Path

from agent.probemesh.plan import EngineConfig

HELPER = "lockstep-probed"
REPO_BUILD = Path(__file__).resolve().parents[2] / "build" / "probemesh" / HELPER


class EngineError(RuntimeError):
    """The engine cannot run (the message says why)."""


def find_helper() -> Path | None:
    explicit = os.environ.get("LOCKSTEP_PROBED")
    if explicit:
        path = Path(explicit)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    if REPO_BUILD.is_file() and os.access(REPO_BUILD, os.X_OK):
        return REPO_BUILD
    found = shutil.which(HELPER)
    return Path(found) if found else None


def config_lines(cfg: EngineConfig) -> list[str]:
    opts = {"window_ns": cfg.window_ns, "interval_ns": cfg.interval_ns, "port": cfg.port,
            "deadline_floor_ns": cfg.deadline_floor_ns, "deadline_k_milli": cfg.deadline_k_milli,
            "deadline_max_ns": cfg.deadline_max_ns, "grace_ns": cfg.grace_ns, "margin_ns": cfg.margin_ns,
            "payload": cfg.payload, "dscp": cfg.dscp, "hw": cfg.hw, "txts": cfg.txts}
    lines = ["reset"] + [f"opt {k} {v}" for k, v in opts.items()]
    for i, nic in enumerate(cfg.nics):
        lines.append(f"nic {i} {nic.name} {nic.interface or '-'} {nic.address} {cfg.sport_first} {cfg.sport_count}")
    for i, (nic, name, addr) in enumerate(cfg.peers):
        lines.append(f"peer {i} {nic} {name} {addr}")
    lines.append("commit")
    return lines


class NativeEngine:
    kind = "native"

    def __init__(self, path: Path | None = None, stderr_lines: int = 20):
        self.path = path or find_helper()
        if self.path is None:
            raise EngineError(f"the native helper {HELPER} is not built (run `make native`, or set LOCKSTEP_PROBED)")
        try:
            self.proc = subprocess.Popen([str(self.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, bufsize=0, close_fds=True)
        except OSError as exc:
            raise EngineError(f"cannot start {self.path}: {exc}") from exc
        os.set_blocking(self.proc.stdout.fileno(), False)
        os.set_blocking(self.proc.stderr.fileno(), False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
        self._sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
        self._buf = b""
        self._stderr: deque[str] = deque(maxlen=stderr_lines)
        self._closed = False
        self.degraded: str | None = None
        self.rate_cap: float | None = None

    # -- control -------------------------------------------------------------------------------
    def _write(self, lines: list[str]) -> None:
        data = ("\n".join(lines) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                n = self.proc.stdin.write(view)
                view = view[n or 0:]
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise EngineError(self._exit_reason(f"writing to the helper: {exc}")) from exc

    def apply(self, cfg: EngineConfig) -> None:
        self._write(config_lines(cfg))

    def set_clock(self, offset_ns: int, synced: bool) -> None:
        self._write([f"clock {int(offset_ns)} {1 if synced else 0}"])

    def trace(self, token: int, peer: int, sport: int, ttl: int) -> None:
        self._write([f"trace {token} {peer} {sport} {ttl}"])

    def traces(self, probes: list[tuple[int, int, int, int]]) -> None:
        if probes:
            self._write([f"trace {t} {p} {s} {ttl}" for t, p, s, ttl in probes])

    # -- events ----------------------------------------------------------------------------------
    def events(self, timeout: float) -> list[dict]:
        """The events the helper printed, waiting up to `timeout` s for the first."""
        out: list[dict] = []
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            remaining = deadline - time.monotonic()
            ready = self._sel.select(max(0.0, remaining)) if not out else self._sel.select(0)
            if not ready:
                break
            for key, _ in ready:
                try:
                    chunk = os.read(key.fileobj.fileno(), 1 << 20)
                except BlockingIOError:
                    continue
                if key.data == "err":
                    if chunk:
                        self._stderr.extend(chunk.decode(errors="replace").splitlines())
                    continue
                if not chunk:
                    raise EngineError(self._exit_reason("the helper closed its output"))
                self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        self._stderr.append(f"unreadable line: {line[:200]!r}")
            if out or remaining <= 0:
                break
        if self.proc.poll() is not None and not out:
            raise EngineError(self._exit_reason("the helper exited"))
        return out

    def _exit_reason(self, what: str) -> str:
        rc = self.proc.poll()
        tail = "; ".join(list(self._stderr)[-3:])
        return f"{what} (exit status {rc}){': ' + tail if tail else ''}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._write(["quit"])
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._sel.close()
        for f in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(Exception):
                f.close()

    @property
    def pid(self) -> int:
        return self.proc.pid
