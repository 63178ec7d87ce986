"""A real console for an emulated fabric: ``manage.py serve`` on 127.0.0.1 and on the fabric's
management bridge (where the hosts' agents reach it), and, when the environment names Redis, a
Celery worker with its beat (the audits and sweeps run there); without Redis the console runs
its periodic tasks in-process. The caller gives the environment (the database) and seeds the
console itself; this module only runs processes and waits on HTTP. No Django here.

    with ConsoleStack(fab, env, log_dir) as stack:
        fab.start_agents(console_url=stack.agent_url, token=..., cluster_id=...)
        requests.get(stack.url + "/api/v1/...")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from .fabric import Fabric

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Process:
    def __init__(self, argv: list[str], env: dict, log: Path):
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._fh.close()


class ConsoleStack:
    def __init__(self, fab: Fabric, env: dict, log_dir: Path, port: int | None = None):
        self.fab, self.env, self.log_dir = fab, dict(env), Path(log_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_url = fab.console_url(self.port)
        self.processes: list[_Process] = []

    def __enter__(self) -> ConsoleStack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = self.env | {"PYTHONUNBUFFERED": "1"}
        try:
            self.processes.append(_Process(
                [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                 "--also-listen", self.fab.bridge_address], env, self.log_dir / "console.log"))
            if env.get("REDIS_URL"):
                worker = _Process([sys.executable, "-m", "celery", "-A", "console", "worker", "--beat", "--pool",
                                   "solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
                                   "--schedule", str(self.log_dir / "beat-schedule"), "--loglevel", "INFO"],
                                  env, self.log_dir / "celery.log")
                self.processes.append(worker)
                self._wait(lambda: "ready" in worker.output(), 90, "the Celery worker to start")
            self._wait(lambda: requests.get(f"{self.url}/healthz", timeout=1).ok, 60, "the console to start")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for p in reversed(self.processes):
            p.stop()
        self.processes.clear()

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-4000:]}" for p in self.processes)

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for p in self.processes:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{p.log.name}: exited with {p.proc.returncode} while waiting for {what}:\n"
                                       + p.output()[-3000:])
            try:
                if predicate():
                    return
            except requests.RequestException as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"timed out after {timeout} s waiting for {what} (last error: {last!r})")
