"""The node supervisor: what ``lockstep run`` is on each node (one per node, as with torchrun).

It launches this node's workers with the environment torchrun's agent would give them, but as
``python -m lockstep.runtime.launch SCRIPT ARGS``, and supervises them itself: a worker's exit is
reported to the orchestrator the moment ``waitpid`` returns (a ``kill -9`` is seen in
milliseconds, not after a collective times out), the other workers keep running. It owns the
node's shared-memory directory where every rank replicates its small state, keeps ``--spares N``
warm spare processes, and starts replacements when the orchestrator asks.

Node 0 (the leader) also hosts the job's TCPStore on ``MASTER_ADDR:MASTER_PORT`` (the workers
use it as torchrun's agent store) and runs the orchestrator as a child process, restarting it
(``--resume``) if it dies. Exit status: 0 when the job finished, else the job's failure status
(1, as torchrun's ``ChildFailedError``), 128+N after signal N.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

from lockstep.orchestrator import jobdir, launchspec
from lockstep.runtime import smallstate

HEARTBEAT_S = 0.3
FORWARD_POLL_S = float(os.environ.get("LOCKSTEP_FORWARD_POLL_S", "0.002"))


def _pdeathsig():
    # Workers die with their supervisor (as they would with torchrun's agent), never orphaned.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Proc:
    def __init__(self, rank, local_rank, popen, incarnation, role):
        self.rank = rank
        self.local_rank = local_rank
        self.popen = popen
        self.incarnation = incarnation
        self.role = role
        self.expected_exit = False


class NodeSupervisor:
    def __init__(self, spec: launchspec.LaunchSpec, *, job: str, spares: int, scheduler: str, quiet: bool = False):
        self.spec = spec
        self.job = job
        self.spares_budget = spares
        self.scheduler = scheduler
        self.quiet = quiet
        self.events: queue.Queue = queue.Queue()
        self.procs: dict[int, Proc] = {}
        self.warm: list[subprocess.Popen] = []
        self.exits_pending: list[dict] = []
        self.orch_sock: socket.socket | None = None
        self._send_lock = threading.Lock()
        self.node_rank = spec.node_rank
        self.store = None
        self.orch_proc: subprocess.Popen | None = None
        self.token = ""
        self.orch_addr = ""
        self.exit_code: int | None = None
        self.done = False
        self.next_spare_slot = spec.nproc_per_node
        self.base_env = dict(os.environ)
        self.base_env.pop("LOCKSTEP_ROLE", None)

    def log(self, msg: str):
        if not self.quiet:
            print(f"lockstep: {msg}", file=sys.stderr, flush=True)

    # -- start-up --------------------------------------------------------------------------

    def _rendezvous(self):
        import torch.distributed as dist

        spec = self.spec
        timeout = timedelta(seconds=float(os.environ.get("LOCKSTEP_RDZV_TIMEOUT_S", "900")))
        leader = spec.node_rank == 0
        if spec.node_rank is None:
            try:
                # All interfaces, as torchrun's agent store: the other nodes' workers connect to it.
                self.store = dist.TCPStore("0.0.0.0", spec.master_port, None, True, timeout=timeout,  # noqa: S104
                                           wait_for_workers=False)
                leader = True
            except Exception:
                leader = False
        if leader:
            if self.store is None:
                self.store = dist.TCPStore("0.0.0.0", spec.master_port, None, True, timeout=timeout,  # noqa: S104
                                           wait_for_workers=False)
            self.node_rank = 0
            self.store.add("lockstep/node_counter", 1)
            self.token = secrets.token_hex(16)
            self._start_orchestrator(resume=False)
            self.store.set("lockstep/orchestrator", self.orch_addr)
            self.store.set("lockstep/token", self.token)
            self.store.set("lockstep/job", self.job)
        else:
            self.store = dist.TCPStore(spec.master_addr, spec.master_port, None, False, timeout=timeout)
            if self.node_rank is None:
                self.node_rank = int(self.store.add("lockstep/node_counter", 1)) - 1
            self.orch_addr = self.store.get("lockstep/orchestrator").decode()
            self.token = self.store.get("lockstep/token").decode()
            self.job = self.store.get("lockstep/job").decode()

    def _start_orchestrator(self, resume: bool):
        spec = self.spec
        port = int(self.orch_addr.rsplit(":", 1)[1]) if self.orch_addr else 0
        env = dict(self.base_env, LOCKSTEP_JOB_TOKEN=self.token,
                   LOCKSTEP_LAUNCH=json.dumps(dataclasses.asdict(spec)), LOCKSTEP_JOB_CWD=os.getcwd())
        cmd = [sys.executable, "-m", "lockstep.orchestrator", "--job", self.job, "--world-size", str(spec.world_size),
               "--nnodes", str(spec.nnodes), "--scheduler", self.scheduler, "--port", str(port),
               "--advertise", spec.master_addr if spec.nnodes > 1 else "127.0.0.1"]
        if resume:
            cmd.append("--resume")
        self.orch_proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=_pdeathsig)
        line = self.orch_proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the orchestrator did not start (it said {line!r})")
        port = int(line.split()[1])
        host = spec.master_addr if spec.nnodes > 1 else "127.0.0.1"
        self.orch_addr = f"{host}:{port}"
        threading.Thread(target=self._drain_orchestrator_stdout, daemon=True).start()
        threading.Thread(target=self._watch_orchestrator, args=(self.orch_proc,), daemon=True).start()

    def _drain_orchestrator_stdout(self):
        proc = self.orch_proc
        for line in proc.stdout:
            sys.stdout.write(line)

    def _watch_orchestrator(self, proc):
        code = proc.wait()
        self.events.put(("orchestrator_exit", code))

    def _node_dir(self) -> str:
        # Per-user directory, mode 0700: the ranks' state is readable by the job's user only.
        root = os.environ.get("LOCKSTEP_SHM_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")  # noqa: S108
        path = os.path.join(root, f"lockstep-{os.getuid()}", f"{self.job}-node{self.node_rank}-{os.getpid()}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(os.path.dirname(path), 0o700)
        return path

    # -- processes -------------------------------------------------------------------------

    def _env_for(self, rank: int, local_rank: int, role: str, generation: int, incarnation: str) -> dict:
        env = launchspec.worker_env(self.spec, rank=rank, local_rank=local_rank, node_rank=self.node_rank,
                                    run_id=self.job, base=self.base_env)
        env.update({
            "LOCKSTEP_JOB": self.job, "LOCKSTEP_ORCHESTRATOR": self.orch_addr, "LOCKSTEP_JOB_TOKEN": self.token,
            "LOCKSTEP_NODE_DIR": self.node_dir, "LOCKSTEP_ROLE": role, "LOCKSTEP_GENERATION": str(generation),
            "LOCKSTEP_INCARNATION": incarnation,
        })
        return env

    def _spawn(self, rank: int, local_rank: int, role: str, generation: int, incarnation: str) -> Proc:
        env = self._env_for(rank, local_rank, role, generation, incarnation)
        argv = self.spec.worker_argv()
        popen = None
        while role == "replacement" and self.warm and popen is None:
            spare = self.warm.pop(0)
            try:
                spare.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}) + "\n")
                spare.stdin.flush()
                spare.stdin.close()
                popen = spare
            except (BrokenPipeError, OSError):  # the warm spare died (killed by someone): use another
                with contextlib.suppress(Exception):
                    spare.kill()
        if popen is None:
            popen = subprocess.Popen([sys.executable, "-m", "lockstep.runtime.launch", *argv], env=env,
                                     preexec_fn=_pdeathsig)
        proc = Proc(rank, local_rank, popen, incarnation, role)
        self.procs[rank] = proc
        threading.Thread(target=self._wait_child, args=(proc,), daemon=True).start()
        return proc

    def _start_warm_spares(self, n: int):
        env = dict(self.base_env)
        if "OMP_NUM_THREADS" not in env and self.spec.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"
        for _ in range(n):
            self.warm.append(subprocess.Popen([sys.executable, "-m", "lockstep.runtime.spare"], env=env,
                                              stdin=subprocess.PIPE, text=True, preexec_fn=_pdeathsig))

    def _wait_child(self, proc: Proc):
        code = proc.popen.wait()
        self.events.put(("child_exit", proc, code))

    def _kill_all(self, sig=signal.SIGTERM, grace: float = 3.0):
        live = [p.popen for p in self.procs.values() if p.popen.poll() is None] + self.warm
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)
        deadline = time.monotonic() + grace
        for p in live:
            left = max(0.0, deadline - time.monotonic())
            try:
                p.wait(left)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()

    # -- the orchestrator connection ------------------------------------------------------

    def send(self, msg: dict):
        line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:
            if self.orch_sock is None:
                if msg.get("op") == "exited":
                    self.exits_pending.append(msg)
                return
            try:
                self.orch_sock.sendall(line)
            except OSError:
                if msg.get("op") == "exited":
                    self.exits_pending.append(msg)
                self._drop()

    def _drop(self):
        sock, self.orch_sock = self.orch_sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _connect_loop(self):
        from lockstep.runtime.transfer import recv_line

        host, port = self.orch_addr.rsplit(":", 1)
        while not self.done:
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                time.sleep(0.2)
                continue
            sock.settimeout(None)
            with self._send_lock:
                hello = {"op": "hello", "role": "supervisor", "token": self.token, "node": self.node_rank,
                         "host": socket.gethostname(), "nproc": self.spec.nproc_per_node, "pid": os.getpid(),
                         "spares": self._spares_left(),
                         "ranks": {str(p.rank): p.popen.pid for p in self.procs.values() if p.popen.poll() is None},
                         "exits": self.exits_pending}
                try:
                    sock.sendall(json.dumps(hello).encode() + b"\n")
                except OSError:
                    sock.close()
                    continue
                self.exits_pending = []
                self.orch_sock = sock
            buf = bytearray()
            try:
                while True:
                    line = recv_line(sock, buf)
                    if line:
                        self.events.put(("orch", json.loads(line)))
            except (ConnectionError, OSError, ValueError):
                pass
            with self._send_lock:
                if self.orch_sock is sock:
                    self._drop()
            time.sleep(0.1)

    def _forward_state(self):
        """Copies of this node's ranks' small state, off the node, as they are written: a rank of
        a lost node is replaced from them (the leader's own ranks need none: the job cannot
        outlive the leader node, which holds its store and orchestrator)."""
        watchers: dict[tuple[int, str], smallstate.SlotWatcher] = {}
        records_size: dict[int, int] = {}
        sent_to = None
        while not self.done:
            time.sleep(FORWARD_POLL_S)
            if self.orch_sock is None:
                continue
            if self.orch_sock is not sent_to:  # a new (restarted) orchestrator: send it everything again
                sent_to = self.orch_sock
                for w in watchers.values():
                    w.rewind()
                records_size.clear()
            for proc in list(self.procs.values()):
                paths = smallstate.rank_paths(self.node_dir, proc.rank)
                for kind in smallstate.KINDS:
                    w = watchers.get((proc.rank, kind))
                    if w is None:
                        w = watchers[(proc.rank, kind)] = smallstate.SlotWatcher(paths[kind])
                    got = w.poll()
                    if got is not None:
                        self.send({"op": "replica", "rank": proc.rank, "kind": kind,
                                   "slot": [got[0], base64.b64encode(got[1]).decode()]})
                try:
                    size = os.path.getsize(paths["records"])
                except FileNotFoundError:
                    continue
                if size != records_size.get(proc.rank):
                    records_size[proc.rank] = size
                    records = [[meta, base64.b64encode(blob).decode()]
                               for meta, blob in smallstate.read_records(paths["records"])]
                    self.send({"op": "replica", "rank": proc.rank, "kind": "records", "records": records})

    def _spares_left(self) -> int:
        return max(0, self.spares_budget - self.spares_used)

    # -- orders ----------------------------------------------------------------------------

    def _order(self, msg: dict):
        op = msg.get("op")
        req = msg.get("req")
        if op == "spawn":
            if self._spares_left() <= 0:
                self.send({"op": "spawn_failed", "req": req, "error": "no spare left on this node"})
                return
            rank = int(msg["rank"])
            old = self.procs.get(rank)
            if msg.get("same_node") and old is not None:
                local_rank = old.local_rank
            else:
                local_rank = self.next_spare_slot
                self.next_spare_slot += 1
            self.spares_used += 1
            proc = self._spawn(rank, local_rank, "replacement", int(msg["generation"]), msg["incarnation"])
            self.log(f"started a replacement for rank {rank} (pid {proc.popen.pid})")
            self.send({"op": "spawned", "req": req, "rank": rank, "pid": proc.popen.pid, "spares": self._spares_left()})
            if len(self.warm) < self._spares_left():
                self._start_warm_spares(1)
        elif op == "read_state":
            rank = int(msg["rank"])
            state = smallstate.read_rank_state(self.node_dir, rank)
            src = {kind: ([state[kind][0], base64.b64encode(state[kind][1]).decode()] if state[kind] else None)
                   for kind in smallstate.KINDS}
            # Every iterator's RNG bundle, an ended one's too: the boundary a replacement resumes
            # at may predate the end (the rank died between the end and its next step).
            src["records"] = [[meta, base64.b64encode(blob).decode()] for meta, blob in state["records"]]
            self.send({"op": "state", "req": req, "rank": rank, "source": src})
        elif op == "expect_exit":
            proc = self.procs.get(int(msg["rank"]))
            if proc is not None and (not msg.get("incarnation") or proc.incarnation == msg["incarnation"]):
                proc.expected_exit = True
            self.send({"op": "ack", "req": req})
        elif op == "kill":
            proc = self.procs.get(int(msg["rank"]))
            if proc is not None and proc.popen.poll() is None and msg.get("incarnation") in (None, proc.incarnation):
                proc.expected_exit = True
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.send_signal(int(msg.get("signal", signal.SIGKILL)))
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(5)  # dead before the ack: it writes no more state
            self.send({"op": "ack", "req": req})
        elif op == "terminate":
            self.log(f"terminating this node's workers: {msg.get('message', '')}")
            self.exit_code = int(msg.get("code", 1))
            self._kill_all()
            self.done = True
        elif op == "done":
            self.exit_code = 0
            self.done_requested = True

    # -- main loop -------------------------------------------------------------------------

    def run(self, join: dict | None = None) -> int:
        """``join``: this node is a spare a scheduler plugin started to host one replacement
        (``{"node", "rank", "generation", "incarnation"}``); the job's orchestrator and token come
        from the environment instead of the rendezvous."""
        self.spares_used = 0
        self.done_requested = False
        for note in self.spec.notes:
            self.log(note)
        if join is None:
            self._rendezvous()
        else:
            self.node_rank = int(join["node"])
            self.orch_addr = os.environ["LOCKSTEP_ORCHESTRATOR"]
            self.token = os.environ["LOCKSTEP_JOB_TOKEN"]
            self.base_env.pop("LOCKSTEP_JOB_TOKEN", None)
        self.node_dir = self._node_dir()
        threading.Thread(target=self._connect_loop, daemon=True).start()
        if self.spec.nnodes > 1 and self.node_rank != 0:
            threading.Thread(target=self._forward_state, daemon=True).start()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, f: self.events.put(("signal", s)))
        if join is None:
            nproc = self.spec.nproc_per_node
            for local in range(nproc):
                rank = self.node_rank * nproc + local
                self._spawn(rank, local, "worker", 0, f"{self.job}-r{rank}-g0")
            self._start_warm_spares(min(self._spares_left(), 1 if self.spares_budget else 0))
        else:
            self._spawn(int(join["rank"]), 0, "replacement", int(join["generation"]), join["incarnation"])
        try:
            return self._loop()
        finally:
            self.done = True
            self._kill_all(signal.SIGKILL, grace=0)
            if self.orch_proc is not None and self.orch_proc.poll() is None:
                self.orch_proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.orch_proc.wait(5)
            shutil.rmtree(self.node_dir, ignore_errors=True)

    def _loop(self) -> int:
        last_beat = 0.0
        while True:
            if self.done:
                return self.exit_code if self.exit_code is not None else 1
            live = [p for p in self.procs.values() if p.popen.poll() is None]
            if self.done_requested and not live:
                return 0
            try:
                ev = self.events.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                ev = None
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_S:
                last_beat = now
                self.send({"op": "heartbeat", "spares": self._spares_left(),
                           "ranks": {str(p.rank): p.popen.pid for p in self.procs.values() if p.popen.poll() is None}})
            if ev is None:
                continue
            kind = ev[0]
            if kind == "child_exit":
                _, proc, code = ev
                if self.procs.get(proc.rank) is proc or proc.expected_exit:
                    self.send({"op": "exited", "rank": proc.rank, "pid": proc.popen.pid, "incarnation": proc.incarnation,
                               "returncode": code, "signal": -code if code < 0 else None,
                               "expected": proc.expected_exit})
            elif kind == "orch":
                self._order(ev[1])
            elif kind == "orchestrator_exit":
                if self.done_requested or self.done:
                    continue
                code = ev[1]
                if code == 0 and not any(p.popen.poll() is None for p in self.procs.values()):
                    return 0
                self.log(f"the orchestrator exited ({code}); restarting it")
                self._start_orchestrator(resume=True)
            elif kind == "signal":
                sig = ev[1]
                self.log(f"got signal {sig}; stopping the job")
                self._kill_all()
                return 128 + sig


def run(spec: launchspec.LaunchSpec, *, job: str, spares: int, scheduler: str) -> int:
    jobdir.check_name(job)
    return NodeSupervisor(spec, job=job, spares=spares, scheduler=scheduler).run()


def spec_from_env() -> launchspec.LaunchSpec:
    return launchspec.LaunchSpec(**json.loads(os.environ["LOCKSTEP_LAUNCH"]))


def join_main(argv=None) -> int:
    """``python -m lockstep.orchestrator.node --join NODE RANK GENERATION INCARNATION``: what a
    scheduler plugin starts on a spare node (environment: LOCKSTEP_ORCHESTRATOR, LOCKSTEP_JOB,
    LOCKSTEP_JOB_TOKEN, LOCKSTEP_LAUNCH)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lockstep.orchestrator.node")
    ap.add_argument("--join", nargs=4, metavar=("NODE", "RANK", "GENERATION", "INCARNATION"), required=True)
    args = ap.parse_args(argv)
    node, rank, generation, incarnation = args.join
    sup = NodeSupervisor(spec_from_env(), job=os.environ["LOCKSTEP_JOB"], spares=0, scheduler="local")
    return sup.run({"node": node, "rank": rank, "generation": generation, "incarnation": incarnation})


if __name__ == "__main__":
    sys.exit(join_main())
