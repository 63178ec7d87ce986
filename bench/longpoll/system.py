"""Process and machine measurements from /proc, and the child processes of the benchmark."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _stat(pid: int) -> tuple[int, list[str]] | None:
    """(ppid, fields after the command name) of a process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields


def postgres_cpu_seconds() -> float | None:
    """CPU seconds of the local PostgreSQL server: the postmaster, its live children, and (through
    the postmaster's cutime/cstime) every child that exited, e.g. short-lived connections."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip().startswith("postgres"):
                    stat = _stat(int(entry.name))
                    if stat:
                        procs[int(entry.name)] = stat
            except (FileNotFoundError, ProcessLookupError):
                continue
    roots = [pid for pid, (ppid, _) in procs.items() if ppid not in procs]
    if not roots:
        return None
    total = 0.0
    for pid, (_ppid, f) in procs.items():
        own = int(f[11]) + int(f[12])
        if pid in roots:
            own += int(f[13]) + int(f[14])  # reaped children (exited backends)
        total += own
    return total / CLOCK_TICKS


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return None
    return None


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return float(sum(values) - idle), float(sum(values))


def established(port: int) -> int:
    """TCP connections in ESTABLISHED state whose local port is `port` (the server's side)."""
    want = f":{port:04X}"
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as fh:
            next(fh, None)
            for line in fh:
                parts = line.split(None, 4)
                if len(parts) > 3 and parts[3] == "01" and parts[1].endswith(want):
                    count += 1
    return count


class CpuMeter:
    """CPU used by a set of processes between start() and stop(), in cores (1.0 = one core busy)."""

    def __init__(self) -> None:
        self.start_wall = 0.0
        self.start_cpu: dict[int, float] = {}

    def start(self, pids) -> None:
        self.start_wall = time.monotonic()
        self.start_cpu = {pid: c for pid in pids if (c := cpu_seconds(pid)) is not None}

    def stop(self, pids) -> float:
        wall = time.monotonic() - self.start_wall
        used = 0.0
        for pid in pids:
            now = cpu_seconds(pid)
            if now is not None:
                used += now - self.start_cpu.get(pid, 0.0)
        return used / wall if wall > 0 else 0.0


class Child:
    """A child process in its own session, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path, cwd: Path) -> None:
        self.name, self.log = name, log
        self._fh = open(log, "wb")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Signal the process group, wait, then kill what is left. The exit code."""
        self.send(sig)
        code = self.wait(timeout)
        if code is None:
            self.send(signal.SIGKILL)
            code = self.wait(10)
        if not self._fh.closed:
            self._fh.close()
        return code

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""
