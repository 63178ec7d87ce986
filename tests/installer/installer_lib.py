"""Helpers for the installer tests: a node's network namespace, snapshots, a tampering proxy."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import ipaddress
import os
import random
import re
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.integration.conftest import ROOT, Process, process_env, wait_until

CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PREFIX = "lsi"  # every namespace, interface and temporary path these tests create starts with it
# Consoles for the tests: short intervals, so a node is ready within a second or two.
CONSOLE_ENV = {
    "LOCKSTEP_AGENT_HEARTBEAT_INTERVAL_S": "1",
    "LOCKSTEP_AGENT_POLL_MAX_WAIT_S": "6",
    "LOCKSTEP_AGENT_POLL_RECHECK_S": "1",
}


def python_args() -> list[str]:
    """``--python`` for the installer when the plain PATH has no Python >= 3.10 (else nothing)."""
    probe = subprocess.run(
        ["sh", "-c", "command -v python3 && python3 -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))'"],
        env={"PATH": CLEAN_PATH}, capture_output=True, text=True, check=False,
    )
    if probe.returncode == 0:
        return []
    base = getattr(sys, "_base_executable", sys.executable)
    return ["--python", base]


def node_target() -> str:
    """The clock-sync target (``cp311-x86_64``) of the Python the installer will pick here."""
    args = python_args()
    python = args[1] if args else "python3"
    tag = subprocess.run([python, "-c", 'import sys; print("cp%d%d" % sys.version_info[:2])'],
                         env={"PATH": CLEAN_PATH}, capture_output=True, text=True, check=True).stdout.strip()
    return f"{tag}-{os.uname().machine}"


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def run(argv: list[str], timeout: float = 240, env: dict | None = None, input: str | None = None) -> Result:
    # A session of its own: no controlling terminal, so the installer never stops to ask for a token.
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, input=input,
                          start_new_session=True,
                          env=env if env is not None else {"PATH": CLEAN_PATH, "LANG": "C.UTF-8"})
    return Result(proc.returncode, proc.stdout, proc.stderr)


class NodeNamespace:
    """A fresh network namespace for one node, with a veth pair to the root namespace.

    The root end holds ``host_ip`` (the console listens there), the node end ``node_ip``;
    both in a /30 of 10.198.0.0/16 that is not in use on this machine.
    """

    def __init__(self):
        tag = secrets.token_hex(3)
        self.name = f"{PREFIX}{tag}"
        self.host_if = f"{PREFIX}{tag}h"
        self.node_if = f"{PREFIX}{tag}n"
        used = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
        while True:
            net = ipaddress.ip_network(f"10.198.{random.randrange(256)}.{4 * random.randrange(64)}/30")
            host, node = (str(a) for a in list(net.hosts())[:2])
            if f" {host}/" not in used and f" {node}/" not in used:
                break
        self.host_ip, self.node_ip = host, node
        commands = [
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if],
            ["ip", "link", "set", self.node_if, "netns", self.name],
            ["ip", "addr", "add", f"{host}/30", "dev", self.host_if],
            ["ip", "link", "set", self.host_if, "up"],
            ["ip", "-n", self.name, "addr", "add", f"{node}/30", "dev", self.node_if],
            ["ip", "-n", self.name, "link", "set", self.node_if, "up"],
            ["ip", "-n", self.name, "link", "set", "lo", "up"],
        ]
        try:
            for argv in commands:
                subprocess.run(argv, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            self.delete()
            raise RuntimeError(f"cannot build the node namespace: {' '.join(exc.cmd)}: {exc.stderr}") from None

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False).stdout
        return sorted(int(p) for p in out.split())

    def sh(self, script: str, timeout: float = 240) -> Result:
        """Run a shell command line in the namespace with a clean environment (as `sudo` gives)."""
        return run(["ip", "netns", "exec", self.name, "env", "-i", f"PATH={CLEAN_PATH}", "LANG=C.UTF-8",
                    "sh", "-c", script], timeout=timeout)

    def delete(self) -> None:
        for pid in self.pids():  # only what the tests started in it: the agent and its supervisor
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)


class Console:
    """The console under uvicorn on ``host``:``port`` (the test database), restartable."""

    def __init__(self, host: str, port: int, log_dir: Path, **env: str):
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"
        self.log_dir = log_dir
        self.env = {**CONSOLE_ENV, **env}
        self.server: Process | None = None
        self.starts = 0

    def start(self) -> Console:
        self.starts += 1
        self.server = Process(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", self.host, "--port",
             str(self.port), "--lifespan", "off", "--timeout-graceful-shutdown", "1"],
            process_env(**self.env), self.log_dir / f"uvicorn-{self.starts}.log",
        )
        wait_until(lambda: requests.get(f"{self.url}/healthz", timeout=1).ok, 30, "the console to start")
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            if os.environ.get("LOCKSTEP_TEST_SHOW_LOGS"):
                sys.stderr.write(self.server.output())
            self.server = None

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("uvicorn-*.log")))


class TamperProxy:
    """Serves GETs by fetching them from the console, but changes the agent package.

    It also publishes the tampered package's own sha256 under ``.sha256``: the installer must
    not believe what the server says, only the sum in the script it fetched from the console.
    """

    def __init__(self, host: str, upstream: str):
        self.upstream = upstream
        self.served: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                proxy.served.append(self.path)
                answer = requests.get(proxy.upstream + self.path, timeout=30)
                body = answer.content
                if re.search(r"/agent/lockstep-agent-[^/]+\.tar\.gz$", self.path):
                    body = proxy.tamper(body)
                elif self.path.endswith(".tar.gz.sha256"):
                    package = proxy.tamper(requests.get(proxy.upstream + self.path[: -len(".sha256")],
                                                        timeout=30).content)
                    body = f"{hashlib.sha256(package).hexdigest()}  {self.path.rsplit('/', 1)[-1][:-7]}\n".encode()
                self.send_response(answer.status_code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def tamper(data: bytes) -> bytes:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- what is on the node ----------------------------------------------------------------------

RUNTIME = (("var", "lib", "lockstep"), ("var", "log", "lockstep"))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every installed path with its type, mode, owner and, for files, size, mtime and sha256.

    What the agent itself writes while it runs (its state directory but the credential, its
    log) is left out; directories are compared without their mtime (the installer's lock is a
    directory it creates and removes in /run/lockstep).
    """
    entries: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(rel.parts[: len(p)] == p for p in RUNTIME) and rel.name != "credential.json" \
                and len(rel.parts) > 3:
            continue
        st = path.lstat()
        kind = stat.S_IFMT(st.st_mode)
        entry: tuple = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        if stat.S_ISREG(st.st_mode):
            entry += (st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
        elif stat.S_ISLNK(st.st_mode):
            entry += (os.readlink(path),)
        entries[str(rel)] = entry
    return entries


def leftovers(root: Path) -> list[str]:
    """Whatever is under ``root`` (the node before the installer ran had nothing there)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def files_containing(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                if needle in path.read_bytes():
                    found.append(str(path.relative_to(root)))
    return found


def pid_of(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def wait_gone(pids, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes still alive after {timeout}s: {[p for p in pids if alive(p)]}")
        time.sleep(0.05)


def repo_file(*parts: str) -> Path:
    return ROOT.joinpath(*parts)


_TOKENS = Path(tempfile.mkdtemp(prefix="lsi-tokens-"))


def token_file(token: str) -> tuple[str, str]:
    """`--token-file PATH` for a file (0600) that holds the token, as an operator's would: the
    installer refuses a token in its command line."""
    handle, path = tempfile.mkstemp(dir=_TOKENS, prefix="token-")
    with os.fdopen(handle, "w") as fh:
        fh.write(token + "\n")
    return ("--token-file", path)

