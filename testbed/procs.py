"""Processes the testbed starts: identity checks, cgroup freezer, signal fallback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

CGROUP_TOP = "lockstep-testbed"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int | None, start: int | None) -> bool:
    """True when `pid` runs and is the same process that was recorded (not a reused pid)."""
    return bool(pid) and start is not None and start_time(pid) == start


def signal_if_same(pid: int, start: int | None, sig: int) -> bool:
    if not alive(pid, start):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids: list[tuple[int, int | None]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p, s) for p, s in pids):
            return True
        time.sleep(0.02)
    return not any(alive(p, s) for p, s in pids)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_by_cmdline(*needles: str) -> list[int]:
    """Pids whose command line contains every one of `needles` as an argument."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            argv = cmdline(int(entry))
            if argv and all(n in argv for n in needles):
                found.append(int(entry))
    return found


class Cgroups:
    """A cgroup v2 subtree ``lockstep-testbed/<prefix>`` for freezing and killing process groups.

    `available` is False where no writable cgroup v2 hierarchy exists; callers then fall back
    to SIGSTOP/SIGCONT and killing recorded pids.
    """

    def __init__(self, prefix: str):
        self.root: Path | None = None
        if os.environ.get("LOCKSTEP_TESTBED_NO_CGROUP") != "1":
            for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                if (candidate / "cgroup.controllers").exists() and os.access(candidate, os.W_OK):
                    self.root = candidate / CGROUP_TOP / prefix
                    break

    @property
    def available(self) -> bool:
        return self.root is not None

    def path(self, *parts: str) -> Path:
        assert self.root is not None
        return self.root.joinpath(*parts)

    def ensure(self, *parts: str) -> Path | None:
        if self.root is None:
            return None
        path = self.path(*parts)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return path

    def procs(self, *parts: str) -> list[int]:
        if self.root is None:
            return []
        pids: list[int] = []
        base = self.path(*parts)
        if not base.exists():
            return []
        for d in [base, *sorted(p for p in base.rglob("*") if p.is_dir())]:
            with contextlib.suppress(FileNotFoundError, OSError):
                pids += [int(x) for x in (d / "cgroup.procs").read_text().split()]
        return pids

    def set_frozen(self, frozen: bool, *parts: str, timeout: float = 5.0) -> bool:
        if self.root is None or not self.path(*parts).exists():
            return False
        path = self.path(*parts)
        (path / "cgroup.freeze").write_text("1" if frozen else "0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = (path / "cgroup.events").read_text()
            if f"frozen {1 if frozen else 0}" in events:
                return True
            time.sleep(0.01)
        return False

    def frozen(self, *parts: str) -> bool:
        if self.root is None or not self.path(*parts).exists():
            return False
        return "frozen 1" in (self.path(*parts) / "cgroup.events").read_text()

    def kill(self, *parts: str) -> None:
        """SIGKILL every process in the subtree (cgroup.kill; works on frozen ones too)."""
        if self.root is None or not self.path(*parts).exists():
            return
        path = self.path(*parts)
        kill_file = path / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
        else:
            for pid in self.procs(*parts):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, timeout: float = 5.0, *parts: str) -> bool:
        """Kill everything below and remove the subtree (deepest first); True when gone."""
        if self.root is None:
            return True
        base = self.path(*parts)
        if not base.exists():
            return True
        self.kill(*parts)
        deadline = time.monotonic() + timeout
        while self.procs(*parts) and time.monotonic() < deadline:
            time.sleep(0.02)
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [base]:
            with contextlib.suppress(OSError):
                d.rmdir()
        parent = base.parent
        if parent.name == CGROUP_TOP:
            with contextlib.suppress(OSError):
                parent.rmdir()  # only succeeds when no other prefix uses it
        return not base.exists()


def spawn(argv: Sequence[str], *, cgroup: Path | None, env: dict | None = None, cwd: str | None = None,
          stdout=None, stderr=None, stdin=subprocess.DEVNULL, new_session: bool = True) -> subprocess.Popen:
    """Start `argv`, first moving the process into `cgroup` (so its children follow it there)."""
    if cgroup is not None:
        wrapped = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *argv]
    else:
        wrapped = list(argv)
    return subprocess.Popen(wrapped, env=env, cwd=cwd, stdout=stdout, stderr=stderr, stdin=stdin,
                            start_new_session=new_session)
