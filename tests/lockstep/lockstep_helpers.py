"""Running training scripts under plain torchrun and under ``lockstep run`` for the tests."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

BIN = Path(sys.executable).parent
SCRIPTS = Path(__file__).parent / "scripts"
_REFERENCES: dict = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"parameters differ from the failure-free run: {different}"


def reference(tmp_root: Path, script: str, args: list[str]) -> dict:
    """The failure-free result of plain torchrun (cached for the session)."""
    key = (script, tuple(args))
    if key not in _REFERENCES:
        out = tmp_root / f"ref-{script}-{'-'.join(args)}.pt"
        for _attempt in range(3):
            out.unlink(missing_ok=True)
            cmd = [str(BIN / "torchrun"), "--nproc-per-node", "4", "--master-port", str(free_port()),
                   str(SCRIPTS / script), str(out), *args]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode == 0:
                break
            # Plain PyTorch's gloo sometimes aborts a rank in its teardown on a loaded machine
            # (std::terminate: "terminate called without an active exception"), after the
            # training. Rank 0 saves only once every collective of the run has completed, so a
            # file of this attempt that loads is the run's result; a save cut short does not load.
            if "terminate called without an active exception" not in proc.stderr:
                break
            with contextlib.suppress(Exception):
                _REFERENCES[key] = load(out)
                break
        if key not in _REFERENCES:
            assert proc.returncode == 0, proc.stderr[-3000:]
            _REFERENCES[key] = load(out)
    return _REFERENCES[key]


class Job:
    """One ``lockstep run -- torchrun --nproc-per-node 4 SCRIPT OUT ARGS`` in the background."""

    def __init__(self, tmp: Path, script: str, args: list[str], *, spares: int = 1, env: dict | None = None,
                 nproc: int = 4, name: str | None = None, subcommand: tuple = ("run",)):
        self.name = name or f"t{os.getpid()}-{random.randrange(1 << 30):x}"
        self.out = tmp / f"{self.name}.pt"
        self.state_dir = tmp / "state"
        self.env = dict(os.environ, LOCKSTEP_STATE_DIR=str(self.state_dir), PYTHONUNBUFFERED="1", **(env or {}))
        self.env.pop("LOCKSTEP_FAULT", None) if not env or "LOCKSTEP_FAULT" not in env else None
        cmd = [str(BIN / "lockstep"), *subcommand, "--job", self.name, "--spares", str(spares), "--",
               "torchrun", "--nproc-per-node", str(nproc), "--master-port", str(free_port()),
               str(SCRIPTS / script), str(self.out), *args]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def cli(self, *args, timeout=120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "lockstep"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def status(self) -> dict | None:
        from lockstep.cli import JobUnreachable, call_job

        os.environ["LOCKSTEP_STATE_DIR"] = str(self.state_dir)
        try:
            reply = call_job(self.name, {"op": "status"}, timeout=5)
        except (JobUnreachable, OSError, ValueError):
            return None
        return reply.get("status")

    def wait_status(self, predicate, what: str, timeout: float = 300) -> dict:
        """The orchestrator's first status for which ``predicate`` holds (polled every 0.1 s);
        fails naming ``what`` if the job ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the job ended before {what}:\n{self.output[-3000:]}"
            st = self.status()
            if st and predicate(st):
                return st
            time.sleep(0.1)
        raise AssertionError(f"not {what} in {timeout} s: {self.status()}\n{self.output[-3000:]}")

    def wait_step(self, step: int, timeout: float = 300) -> dict:
        return self.wait_status(lambda st: all(r["status"] == "running" for r in st["ranks"]) and
                                min(r["step"] for r in st["ranks"]) >= step, f"every rank at step {step}", timeout)

    def worker_pid(self, rank: int) -> int:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if env.get(b"LOCKSTEP_JOB") == self.name.encode() and env.get(b"RANK") == str(rank).encode() \
                    and env.get(b"LOCKSTEP_ROLE") in (b"worker", b"replacement") and b"LOCKSTEP_SHADOW" not in env:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"lockstep.runtime" in f.read():
                        return int(pid)
        raise AssertionError(f"no process for rank {rank} of job {self.name}")

    def kill_rank(self, rank: int):
        os.kill(self.worker_pid(rank), signal.SIGKILL)

    def wait(self, timeout: float = 600) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the job did not finish in {timeout} s:\n{self.output[-3000:]}") from None
        self._reader.join(5)
        return code

    def result(self) -> dict:
        assert self.out.exists(), f"the job wrote no result:\n{self.output[-3000:]}"
        return load(self.out)

    def recoveries(self) -> list[dict]:
        data = json.loads((self.state_dir / "jobs" / self.name / "state.json").read_text())
        return [h for h in data["history"] if h["kind"] == "job.migration_finished"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class AgentListener:
    """A stand-in for the node agent's local socket (newline-delimited JSON over a Unix stream
    socket, per the contract), collecting the events it is sent."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.events: list[dict] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        buf = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.events.append(json.loads(line))

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events]

    def close(self):
        self.sock.close()
