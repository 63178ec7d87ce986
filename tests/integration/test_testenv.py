"""`make test`'s environment: the local PostgreSQL and Redis when they answer, the embedded
defaults when they do not, and one line that says which."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.integration.conftest import ROOT

SCRIPT = ROOT / "scripts" / "testenv.py"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith("LOCKSTEP_TEST_")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env=base | env, cwd=ROOT)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when we return: nothing listens there


def test_unreachable_services_fall_back_to_the_embedded_defaults_and_say_why():
    port = closed_port()
    out = run("--", sys.executable, "-c", "import os; print('DB=' + os.environ.get('DATABASE_URL', '-'), "
              "'REDIS=' + os.environ.get('REDIS_URL', '-'))",
              LOCKSTEP_TEST_PG=f"127.0.0.1:{port}", LOCKSTEP_TEST_REDIS=f"127.0.0.1:{port}")
    first, second = out.stdout.splitlines()[:2]
    assert out.returncode == 0, out.stderr
    assert first.startswith(f"lockstep tests: SQLite (no PostgreSQL at 127.0.0.1:{port}: ")
    assert f"no Redis (none at 127.0.0.1:{port}: Connection refused)" in first
    assert "root+netns " in first and "chromium " in first
    assert second == "DB=- REDIS=-"


def test_explicit_urls_win_and_the_embedded_mode_ignores_them():
    out = run("--check", DATABASE_URL="postgresql://u@db.example:6543/ci", REDIS_URL="redis://cache:6380/3")
    assert out.stdout.startswith("lockstep tests: PostgreSQL db.example:6543/ci (DATABASE_URL), "
                                 "Redis cache:6380/3 (REDIS_URL), ")
    out = run("--embedded", "--", sys.executable, "-c", "import os; print('DATABASE_URL' in os.environ)",
              DATABASE_URL="postgresql://u@db.example/ci")
    assert out.stdout.splitlines()[0].startswith("lockstep tests: SQLite (embedded), no Redis (embedded), ")
    assert out.stdout.splitlines()[1] == "False"


def test_local_services_that_answer_are_used(tmp_path):
    """Uses the machine's PostgreSQL and Redis when they run (the lockstep_test database)."""
    out = run("--", sys.executable, "-c", "import os; print(os.environ.get('DATABASE_URL', '-'))")
    line, url = out.stdout.splitlines()[:2]
    if "SQLite" in line:  # this machine has no PostgreSQL running nor installed: the fallback was named
        assert "no PostgreSQL at 127.0.0.1:5432" in line and url == "-"
        return
    assert line.startswith("lockstep tests: PostgreSQL 127.0.0.1:5432/lockstep_test, ")
    assert url == "postgresql://postgres@127.0.0.1:5432/lockstep_test"
