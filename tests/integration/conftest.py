"""Real processes for end-to-end tests: the console under uvicorn, a Celery worker.

They share the test database (PostgreSQL's test database, or SQLite's test file), so tests
that use them need `transactional_db`: what the test writes is committed and visible.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(**extra) -> dict:
    """Environment for a child process that must use the test database."""
    env = dict(os.environ)
    settings_dict = connection.settings_dict
    if settings_dict["ENGINE"].endswith("postgresql"):
        user = settings_dict["USER"] or "postgres"
        host = settings_dict["HOST"] or "127.0.0.1"
        port = settings_dict["PORT"] or "5432"
        env["DATABASE_URL"] = f"postgresql://{user}@{host}:{port}/{settings_dict['NAME']}"
    else:
        env.pop("DATABASE_URL", None)
        env["SQLITE_PATH"] = settings_dict["NAME"]
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")


class Process:
    def __init__(self, argv, env, log: Path):
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115  (closed in stop(), outlives this call)
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._fh.close()


@pytest.fixture
def live_console(transactional_db, tmp_path):
    """The console served by a real uvicorn process; yields its base URL."""
    port = free_port()
    server = Process(
        [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off"],
        process_env(), tmp_path / "uvicorn.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=1).ok, 30, "the console to start")
        yield base
    finally:
        server.stop()
        if os.environ.get("LOCKSTEP_TEST_SHOW_LOGS"):
            sys.stderr.write(server.output())


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path):
    worker = Process(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo", "--concurrency", "1",
         "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        process_env(), tmp_path / "celery.log",
    )
    try:
        wait_until(lambda: "ready" in worker.output(), 60, "the Celery worker to start")
        yield worker
    finally:
        worker.stop()
