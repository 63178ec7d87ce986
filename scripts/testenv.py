"""Run the test suite on the parts this machine has, and say which in one line.

    python scripts/testenv.py [--embedded] [--check] [-- COMMAND ...]

PostgreSQL and Redis: ``DATABASE_URL`` / ``REDIS_URL`` when set (an empty value means the
embedded default); otherwise the local servers at 127.0.0.1:5432 (user ``postgres``, trust
auth, as Debian's package sets up) and 127.0.0.1:6379, started first when they are installed
but down and we are root (as ``.ci/run`` does). The database is ``LOCKSTEP_TEST_DB_NAME``
(default ``lockstep_test``; created when missing; pytest-django makes ``test_<name>`` beside it)
and the Redis database number ``LOCKSTEP_TEST_REDIS_DB`` (default 0); ``LOCKSTEP_TEST_PG`` and
``LOCKSTEP_TEST_REDIS`` (``host:port``) look elsewhere, and then nothing is started.
``--embedded`` uses neither (``make test-sqlite``). Then it prints, e.g.::

    lockstep tests: PostgreSQL 127.0.0.1:5432/lockstep_test, Redis 127.0.0.1:6379/0, root+netns yes, chromium yes

and runs COMMAND with that environment (``--check``: only print the line).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

PG_USER = "postgres"
START_WAIT_S = 30


def _address(env_key: str, default_port: int) -> tuple[str, int, bool]:
    """(host, port, local default?) from ``env_key`` (``host:port``)."""
    raw = os.environ.get(env_key, "")
    if not raw:
        return "127.0.0.1", default_port, True
    host, _, port = raw.rpartition(":")
    return host or "127.0.0.1", int(port), False


PG_HOST, PG_PORT, PG_LOCAL = _address("LOCKSTEP_TEST_PG", 5432)
REDIS_HOST, REDIS_PORT, REDIS_LOCAL = _address("LOCKSTEP_TEST_REDIS", 6379)


def _pg_problem(dbname: str = "postgres") -> str | None:
    """Why we cannot use the local PostgreSQL, or None when we can."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (make installs it into .venv)"
    try:
        with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname=dbname, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _start_postgres() -> None:
    clusters = sorted(glob.glob("/etc/postgresql/*/main"))
    if os.geteuid() != 0 or not clusters or not shutil.which("pg_ctlcluster"):
        return
    version = Path(clusters[-1]).parent.name
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
                   capture_output=True, timeout=60)


def _ensure_database(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True,
                         connect_timeout=3) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _redis_problem() -> str | None:
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=3) as conn:
            conn.sendall(b"PING\r\n")
            answer = conn.recv(64)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None if answer.startswith((b"+PONG", b"-NOAUTH")) else f"answered {answer[:40]!r} to PING"


def _start_redis() -> None:
    if os.geteuid() != 0 or not shutil.which("redis-server"):
        return
    subprocess.run(["redis-server", "--daemonize", "yes", "--bind", REDIS_HOST, "--port", str(REDIS_PORT),
                    "--save", "", "--appendonly", "no"], capture_output=True, timeout=60)


def _wait(problem) -> str | None:
    deadline = time.monotonic() + START_WAIT_S
    reason = problem()
    while reason is not None and time.monotonic() < deadline:
        time.sleep(0.5)
        reason = problem()
    return reason


def database(env: dict, embedded: bool) -> str:
    """Set DATABASE_URL in ``env``; the words for the summary line."""
    if embedded:
        env.pop("DATABASE_URL", None)
        return "SQLite (embedded)"
    if "DATABASE_URL" in env:
        if not env["DATABASE_URL"]:
            del env["DATABASE_URL"]
            return "SQLite (DATABASE_URL is empty)"
        parts = urlsplit(env["DATABASE_URL"])
        return f"PostgreSQL {parts.hostname}:{parts.port or 5432}{parts.path} (DATABASE_URL)"
    reason = _pg_problem()
    if reason is not None and PG_LOCAL and shutil.which("pg_ctlcluster"):
        _start_postgres()
        reason = _wait(_pg_problem)
    if reason is not None:
        return f"SQLite (no PostgreSQL at {PG_HOST}:{PG_PORT}: {reason})"
    name = env.get("LOCKSTEP_TEST_DB_NAME") or "lockstep_test"
    _ensure_database(name)
    env["DATABASE_URL"] = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    return f"PostgreSQL {PG_HOST}:{PG_PORT}/{name}"


def redis(env: dict, embedded: bool) -> str:
    if embedded:
        env.pop("REDIS_URL", None)
        return "no Redis (embedded)"
    if "REDIS_URL" in env:
        if not env["REDIS_URL"]:
            del env["REDIS_URL"]
            return "no Redis (REDIS_URL is empty)"
        parts = urlsplit(env["REDIS_URL"])
        return f"Redis {parts.hostname}:{parts.port or 6379}{parts.path or '/0'} (REDIS_URL)"
    reason = _redis_problem()
    if reason is not None and REDIS_LOCAL and shutil.which("redis-server"):
        _start_redis()
        reason = _wait(_redis_problem)
    if reason is not None:
        return f"no Redis (none at {REDIS_HOST}:{REDIS_PORT}: {reason})"
    number = env.get("LOCKSTEP_TEST_REDIS_DB") or "0"
    env["REDIS_URL"] = f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"
    return f"Redis {REDIS_HOST}:{REDIS_PORT}/{number}"


def namespaces() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from testbed.netops import netns_problem
    except Exception as exc:  # the testbed cannot even be imported: its tests will say why
        return f"root+netns no ({exc})"
    problem = netns_problem()
    return "root+netns yes" if problem is None else f"root+netns no ({problem})"


def chromium() -> str:
    missing = [name for name, found in (
        ("chromium", any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome"))),
        ("chromedriver", shutil.which("chromedriver")),
    ) if not found]
    return "chromium yes" if not missing else f"chromium no ({' and '.join(missing)} not installed)"


def main(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    else:
        command = []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedded", action="store_true", help="SQLite and no Redis, whatever runs here")
    parser.add_argument("--check", action="store_true", help="print the line, run nothing")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    # The tests ask for development mode explicitly; the console's default is production.
    env.setdefault("DEBUG", "true")
    parts = [database(env, args.embedded), redis(env, args.embedded), namespaces(), chromium()]
    print("lockstep tests: " + ", ".join(parts), flush=True)
    if args.check or not command:
        return 0
    os.execvpe(command[0], command, env)  # noqa: S606 - the test command, as make gave it
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
