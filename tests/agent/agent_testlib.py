"""Helpers for the agent tests: waiting on conditions with deadlines, paths, configs."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agent.config import Config, from_values

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DATA = HERE / "data"
PYTHON = sys.executable

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition", interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def agent_config(state_dir: Path, console_url: str | None = None, **keys: str) -> Config:
    """A Config from LOCKSTEP_* values; keys are given without the prefix: backoff_max_s="0.5"."""
    values = {"LOCKSTEP_STATE_DIR": str(state_dir), "LOCKSTEP_AGENT_SOCKET": str(Path(state_dir) / "agent.sock")}
    if console_url:
        values["LOCKSTEP_CONSOLE_URL"] = console_url
    for key, value in keys.items():
        values[f"LOCKSTEP_{key.upper()}"] = str(value)
    return from_values(values)


def subprocess_env(**keys: str) -> dict[str, str]:
    """Environment for `python -m agent ...` in a subprocess: no inherited LOCKSTEP_ keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])
    env["PYTHONUNBUFFERED"] = "1"
    # never the machine's /run/lockstep/agent.sock: tests (and other checkouts) run side by side
    keys.setdefault("agent_socket", str(Path(keys["state_dir"]) / "agent.sock") if "state_dir" in keys else "none")
    for key, value in keys.items():
        env[f"LOCKSTEP_{key.upper()}"] = str(value)
    return env


def count_lines(path: Path, needle: str) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.split()[0] == needle)
