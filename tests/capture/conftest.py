"""Helpers for the capture, checkpoint and weight-push tests (CPU, gloo; no Django needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def run_python(code: str, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with the repository importable; fail loudly on error."""
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], env=env or child_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def wait_for(condition, timeout: float = 60.0, what: str = "condition"):
    """Poll ``condition`` until it is truthy (returns its value) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc (``T`` when stopped), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


@pytest.fixture
def engine():
    from lockstep.capture import Engine

    eng = Engine(name="test-capture")
    yield eng
    eng.close(wait=False)
