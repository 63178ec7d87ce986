"""The node supervisor: what ``lockstep run`` is on each node (one per node, as with torchrun).

It launches this node's workers with the environment torchrun's agent would give them, but as
``python -m lockstep.runtime.launch SCRIPT ARGS``, and supervises them itself: a worker's exit is
reported to the orchestrator the moment ``waitpid`` returns (a ``kill -9`` is seen in
milliseconds, not after a collective times out), the other workers keep running. It owns the
node's shared-memory directory where every rank replicates its small state, keeps ``--spares N``
warm spare processes, and starts replacements when the orchestrator asks. In a multi-node job it
also runs a ``PeerServer``: it sends its ranks' small state to the next node's supervisor and
keeps the previous node's, and it watches the node that runs the orchestrator, taking over if it
is that node's first successor (``_take_over``; the design is in ``server``'s docstring).

Node 0 (the leader) also hosts the job's TCPStore on ``MASTER_ADDR:MASTER_PORT`` (the workers
use it as torchrun's agent store) and runs the orchestrator as a child process, restarting it
(``--resume``) if it dies; after a takeover the successor does both. Exit status: 0 when the job finished, else the job's failure status
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
from lockstep.runtime import offnode, priority, smallstate

HEARTBEAT_S = 0.3
# The forwarder is woken by the ranks' writes; this is only how often it looks without a wake
# (a records file that grew on its own, a rank's first file).
FORWARD_IDLE_S = 0.05
# Tests only: the forwarder waits this long before each batch, so that the ranks outrun it.
COPY_DELAY_S = float(os.environ.get("LOCKSTEP_TEST_COPY_DELAY_S", "0"))
# A node whose orchestrator is lost: how long the successor may take to answer at its standby
# address before this node gives the job up (the successor was lost too).
TAKEOVER_TIMEOUT_S = float(os.environ.get("LOCKSTEP_TAKEOVER_TIMEOUT_S", "30"))
NODE_TIMEOUT_S = float(os.environ.get("LOCKSTEP_NODE_TIMEOUT_S", "1.5"))


def _pdeathsig():
    # Workers die with their supervisor (as they would with torchrun's agent), never orphaned.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pdeathsig_idle():
    # A shadow: also at idle CPU priority from its first instruction (its imports included), so
    # it takes only the cycles the ranks leave (only where it may come back: priority.can_restore).
    _pdeathsig()
    priority.lower_self()


class Proc:
    def __init__(self, rank, local_rank, popen, incarnation, role):
        self.rank = rank
        self.local_rank = local_rank
        self.popen = popen
        self.incarnation = incarnation
        self.role = role
        self.expected_exit = False


def _local_address_towards(host: str) -> str:
    """This host's address on the route to ``host`` (what the other nodes reach it at)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _keepalive(sock: socket.socket):
    """A peer host that dies without closing the connection is noticed in about NODE_TIMEOUT_S."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    with contextlib.suppress(AttributeError, OSError):
        idle = max(1, int(NODE_TIMEOUT_S / 2))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)


class PeerServer:
    """A supervisor's server for the other nodes' supervisors (multi-node jobs). A connection
    opens with ``{"op": "hello", "token", "node", "kind"}``:

    * ``kind: "copies"`` -- the sender's ranks' small state, one ``RANK KIND JSON`` line per new
      value (``SlotWatcher``; KIND one of ``smallstate.KINDS`` with a ``[step, base64]`` slot,
      ``records`` with a rank's whole records file, ``records+`` with the records appended since
      the last line), and ``- N`` closing batch N, answered with a line ``N`` (the batch is held:
      the sender's ranks may run on, ``offnode``). Held here, in memory and unparsed (this
      thread must keep up with every step of every rank it holds), for the orchestrator to read
      (``read_copy``) if the sender's node is lost. Peer to peer: the copies never pass through
      the orchestrator;
    * ``kind: "watch"`` -- kept open and silent while this node runs the orchestrator; the
      watcher takes its closing (the process died) or its silence (keep-alive: the host died)
      for the loss of this node, unless a ``{"op": "bye", "code"}`` came first (this
      supervisor ended: the job finished, or was stopped with that status)."""

    def __init__(self, sup: NodeSupervisor, host: str):
        self.sup = sup
        self.sock = socket.create_server(("0.0.0.0", 0))  # noqa: S104 (other nodes' supervisors; hello needs the token)
        self.addr = f"{host}:{self.sock.getsockname()[1]}"
        self.copies: dict[int, dict] = {}
        self.watchers: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, name="lockstep-peers", daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        import hmac

        from lockstep.runtime.transfer import recv_line

        buf = bytearray()
        try:
            hello = json.loads(recv_line(conn, buf))
            if hello.get("op") != "hello" or not hmac.compare_digest(str(hello.get("token", "")), self.sup.token):
                conn.close()
                return
            if hello.get("kind") == "watch":
                _keepalive(conn)
                with self.lock:
                    self.watchers.append(conn)
                while conn.recv(1 << 10):
                    pass
                return
            while True:
                line = recv_line(conn, buf)
                if line.startswith(b"- "):  # the end of a batch: held, say so
                    conn.sendall(line[2:] + b"\n")
                    continue
                rank, kind, value = line.split(b" ", 2)
                with self.lock:
                    held = self.copies.setdefault(int(rank), {})
                    if kind == b"records+":
                        held.setdefault("records", []).append(value)
                    elif kind == b"records":
                        held["records"] = [value]
                    else:
                        held[kind.decode()] = value
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            with self.lock:
                if conn in self.watchers:
                    self.watchers.remove(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def copy_of(self, rank: int) -> dict:
        """``read_state``'s format: ``{"post": [step, base64] | None, "mid", "pre", "records": [...]}``."""
        with self.lock:
            raw = dict(self.copies.get(rank, {}))
        copy = {kind: None for kind in smallstate.KINDS} | {"records": []}
        copy.update({kind: json.loads(value) for kind, value in raw.items() if kind in smallstate.KINDS})
        copy["records"] = [record for part in raw.get("records", []) for record in json.loads(part)]
        return copy

    def bye(self, code: int):
        with self.lock:
            watchers, self.watchers = self.watchers, []
        for conn in watchers:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"op": "bye", "code": code}).encode() + b"\n")
                conn.close()


class NodeSupervisor:
    def __init__(self, spec: launchspec.LaunchSpec, *, job: str, spares: int, scheduler: str, quiet: bool = False):
        self.spec = spec
        self.job = job
        self.spares_budget = spares
        self.scheduler = scheduler
        self.quiet = quiet
        self.events: queue.Queue = queue.Queue()
        self.procs: dict[int, Proc] = {}
        # Shadows (``shadow`` orders): replacements that fast-forward behind a live rank until it
        # is lost (``adopt`` makes one that rank's process) or the job ends.
        self.shadows: dict[int, Proc] = {}
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
        # Multi-node jobs: the peer server, the address this node is reached at, the listening
        # port an orchestrator started here on a takeover gets (reserved now, announced in the
        # hello), and what the orchestrator's ``peers`` order said: where this node's copies go,
        # which node runs the orchestrator (watched), who succeeds it, where the store is.
        self.peer: PeerServer | None = None
        self.advertise = "127.0.0.1"
        self.standby: socket.socket | None = None
        self.holder_addr: str | None = None
        self.orch_node: int | None = 0
        self.orch_peer: str | None = None
        self.succession: list[dict] = []
        self.store_addr: str | None = None
        self.journal: dict | None = None
        self.takeover_wait: float | None = None  # since when this node waits for a successor
        # What the holder acknowledged, told to each rank (``offnode``); batches sent, not yet
        # acknowledged, with the steps of each rank's slots in them.
        self.written: offnode.Written | None = None
        self.copy_states: dict[int, offnode.CopyState] = {}
        self._copy_lock = threading.Lock()
        self._acks_pending: dict[int, dict[int, dict[str, int]]] = {}
        self._ack_sock: socket.socket | None = None
        self._holder_changed = threading.Event()

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
            self.advertise = spec.master_addr if spec.nnodes > 1 else "127.0.0.1"
            self._start_peering()
            self._start_orchestrator(resume=False)
            self.store.set("lockstep/orchestrator", self.orch_addr)
            self.store.set("lockstep/orchestrator_peer", self.peer.addr if self.peer else "")
            self.store.set("lockstep/token", self.token)
            self.store.set("lockstep/job", self.job)
        else:
            self.store = dist.TCPStore(spec.master_addr, spec.master_port, None, False, timeout=timeout)
            if self.node_rank is None:
                self.node_rank = int(self.store.add("lockstep/node_counter", 1)) - 1
            self.orch_addr = self.store.get("lockstep/orchestrator").decode()
            self.token = self.store.get("lockstep/token").decode()
            self.job = self.store.get("lockstep/job").decode()
            self.orch_peer = self.store.get("lockstep/orchestrator_peer").decode() or None
            self.advertise = _local_address_towards(spec.master_addr)
            self._start_peering()

    def _start_peering(self):
        if self.spec.nnodes > 1:
            self.peer = PeerServer(self, self.advertise)
            self.standby = socket.socket()
            self.standby.bind(("0.0.0.0", 0))  # noqa: S104 (an orchestrator's port: hello needs the token)

    def _publish_orchestrator(self):
        """This node's ranks reconnect to the address in this file (the orchestrator may move)."""
        if getattr(self, "node_dir", None):
            jobdir.write_json(os.path.join(self.node_dir, "orchestrator.json"), {"addr": self.orch_addr})

    def _start_orchestrator(self, resume: bool, takeover_from: int | None = None):
        spec = self.spec
        port = int(self.orch_addr.rsplit(":", 1)[1]) if self.orch_addr else 0
        env = dict(self.base_env, LOCKSTEP_JOB_TOKEN=self.token,
                   LOCKSTEP_LAUNCH=json.dumps(dataclasses.asdict(spec)), LOCKSTEP_JOB_CWD=os.getcwd())
        cmd = [sys.executable, "-m", "lockstep.orchestrator", "--job", self.job, "--world-size", str(spec.world_size),
               "--nnodes", str(spec.nnodes), "--scheduler", self.scheduler, "--port", str(port),
               "--advertise", self.advertise, "--node", str(self.node_rank)]
        if self.store_addr:
            cmd += ["--store", self.store_addr]
        if takeover_from is not None:
            cmd += ["--takeover-from", str(takeover_from)]
        elif resume:
            cmd.append("--resume")
        self.orch_proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=_pdeathsig)
        line = self.orch_proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"the orchestrator did not start (it said {line!r})")
        port = int(line.split()[1])
        self.orch_addr = f"{self.advertise}:{port}"
        self._publish_orchestrator()
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
        if self.store_addr:
            # The job's store moved with its orchestrator: the script's init_process_group meets it there.
            env["MASTER_ADDR"], env["MASTER_PORT"] = self.store_addr.rsplit(":", 1)
            env["LOCKSTEP_STORE"] = self.store_addr
        return env

    def _spawn(self, rank: int, local_rank: int, role: str, generation: int, incarnation: str,
               shadow: bool = False) -> Proc:
        env = self._env_for(rank, local_rank, role, generation, incarnation)
        if shadow:
            env["LOCKSTEP_SHADOW"] = "1"
        else:
            self._new_incarnation(rank)
        argv = self.spec.worker_argv()
        popen = None
        # A shadow starts cold at idle priority: the warm spare stays for a rank lost meanwhile.
        while role == "replacement" and not shadow and self.warm and popen is None:
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
            idle = shadow and priority.can_restore()
            popen = subprocess.Popen([sys.executable, "-m", "lockstep.runtime.launch", *argv], env=env,
                                     preexec_fn=_pdeathsig_idle if idle else _pdeathsig)
        proc = Proc(rank, local_rank, popen, incarnation, role)
        (self.shadows if shadow else self.procs)[rank] = proc
        threading.Thread(target=self._wait_child, args=(proc,), daemon=True).start()
        return proc

    def _new_incarnation(self, rank: int):
        if self.written is not None:
            with self._copy_lock:
                state = self.copy_states.get(rank)
                if state is None:
                    state = self.copy_states[rank] = offnode.CopyState(self.node_dir, rank)
                # A new incarnation: nothing of it is held off the node yet.
                state.set(gate=bool(self.holder_addr), post=offnode.NONE, mid=offnode.NONE)

    def _start_warm_spares(self, n: int):
        env = dict(self.base_env)
        if "OMP_NUM_THREADS" not in env and self.spec.nproc_per_node > 1:
            env["OMP_NUM_THREADS"] = "1"
        env["LOCKSTEP_NODE_DIR"] = self.node_dir  # where the workers list the libraries to import
        for _ in range(n):
            self.warm.append(subprocess.Popen([sys.executable, "-m", "lockstep.runtime.spare"], env=env,
                                              stdin=subprocess.PIPE, text=True, preexec_fn=_pdeathsig))

    def _wait_child(self, proc: Proc):
        code = proc.popen.wait()
        self.events.put(("child_exit", proc, code))

    def _kill_all(self, sig=signal.SIGTERM, grace: float = 3.0):
        live = [p.popen for p in [*self.procs.values(), *self.shadows.values()] if p.popen.poll() is None] + self.warm
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

        while not self.done:
            addr = self.orch_addr
            host, port = addr.rsplit(":", 1)
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                time.sleep(0.2)
                continue
            sock.settimeout(None)
            with self._send_lock:
                if addr != self.orch_addr:  # the orchestrator moved while this connected
                    sock.close()
                    continue
                hello = {"op": "hello", "role": "supervisor", "token": self.token, "node": self.node_rank,
                         "host": socket.gethostname(), "nproc": self.spec.nproc_per_node, "pid": os.getpid(),
                         "spares": self._spares_left(), "peer": self.peer.addr if self.peer else "",
                         "standby": f"{self.advertise}:{self.standby.getsockname()[1]}" if self.standby else "",
                         "ranks": {str(p.rank): p.popen.pid for p in self.procs.values() if p.popen.poll() is None},
                         "exits": self.exits_pending}
                try:
                    sock.sendall(json.dumps(hello).encode() + b"\n")
                except OSError:
                    sock.close()
                    continue
                self.exits_pending = []
                self.orch_sock = sock
                self.takeover_wait = None
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
        """Copies of this node's ranks' small state, off the node, as they are written: sent
        straight to the supervisor of the node the orchestrator named as this one's holder
        (``core.ring``), which keeps them for the replacements of this node's ranks if the node
        is lost -- the orchestrator's node too, whose first successor is its holder.

        Woken by the ranks' writes (``offnode.Written``), it sends each new slot and only the
        new tail of each records file, then a ``- N`` line closing batch N; the holder answers
        ``N`` once it holds the batch, and ``_read_acks`` tells each rank which of its steps are
        held off the node (``offnode.CopyState``), which bounds how far the rank runs ahead of
        its copy. Each pass reads a rank's slots before its records: a batch holding ``post(k)``
        holds every record written before it."""
        watchers: dict[tuple[int, str], smallstate.SlotWatcher] = {}
        records_sent: dict[int, int] = {}  # rank -> bytes of its records file the holder has
        sock, sent_to, retry_at = None, None, 0.0
        batch = 0
        while not self.done:
            seen = self.written.value()
            target = self.holder_addr
            if target != sent_to or sock is None:
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                    sock = None
                with self._copy_lock:
                    # What an earlier holder acknowledged is not held by the next one.
                    self._acks_pending = {}
                    self._ack_sock = None
                    for state in self.copy_states.values():
                        state.set(gate=bool(target), post=offnode.NONE, mid=offnode.NONE)
                sent_to = None
                if not target or time.monotonic() < retry_at:
                    # No holder (yet, or none left), or a retry's back-off: a ``peers`` order ends it.
                    self._holder_changed.wait(0.2)
                    self._holder_changed.clear()
                    continue
                try:
                    host, port = target.rsplit(":", 1)
                    sock = socket.create_connection((host, int(port)), timeout=5)
                    sock.settimeout(None)
                    _keepalive(sock)
                    sock.sendall(json.dumps({"op": "hello", "token": self.token, "node": self.node_rank,
                                             "kind": "copies"}).encode() + b"\n")
                except OSError:
                    sock, retry_at = None, time.monotonic() + 0.2
                    continue
                with self._copy_lock:
                    self._ack_sock = sock
                threading.Thread(target=self._read_acks, args=(sock,), name="lockstep-copy-acks", daemon=True).start()
                # A new holder: send it everything again -- of the live ranks. A rank that died
                # here is read from this node's memory, and one that moved away must not send
                # its stale copy to a holder that may hold its new node's copies too.
                sent_to = target
                live = {p.rank for p in self.procs.values() if p.popen.poll() is None}
                for (rank, _), w in watchers.items():
                    if rank in live:
                        w.rewind()
                for rank in live:
                    records_sent.pop(rank, None)
            lines, steps = [], {}
            for proc in list(self.procs.values()):
                paths = smallstate.rank_paths(self.node_dir, proc.rank)
                for kind in smallstate.KINDS:
                    w = watchers.get((proc.rank, kind))
                    if w is None:
                        w = watchers[(proc.rank, kind)] = smallstate.SlotWatcher(paths[kind])
                    got = w.poll()
                    if got is not None:
                        lines.append(f"{proc.rank} {kind} " + json.dumps([got[0], base64.b64encode(got[1]).decode()]))
                        steps.setdefault(proc.rank, {})[kind] = got[0]
                offset = records_sent.get(proc.rank, 0)
                records, end = smallstate.read_records_from(paths["records"], offset)
                if end != offset or proc.rank not in records_sent:
                    records_sent[proc.rank] = end
                    # The whole history to a new holder, the new tail to the same one.
                    kind = "records+" if offset else "records"
                    lines.append(f"{proc.rank} {kind} " + json.dumps(
                        [[meta, base64.b64encode(blob).decode()] for meta, blob in records], separators=(",", ":")))
            if lines:
                if COPY_DELAY_S:
                    time.sleep(COPY_DELAY_S)  # tests: a forwarder that lags behind the ranks
                batch += 1
                with self._copy_lock:
                    self._acks_pending[batch] = steps
                try:
                    sock.sendall("".join(line + "\n" for line in lines).encode() + f"- {batch}\n".encode())
                except OSError:
                    sock, retry_at = None, time.monotonic() + 0.2
                    continue
            self.written.wait(seen, FORWARD_IDLE_S)

    def _read_acks(self, sock: socket.socket):
        """The holder's ``N`` lines: batch N and the ones before it are held there."""
        from lockstep.runtime.transfer import recv_line

        buf = bytearray()
        with contextlib.suppress(ConnectionError, OSError, ValueError):
            while True:
                acked = int(recv_line(sock, buf))
                with self._copy_lock:
                    if self._ack_sock is not sock:
                        return
                    for n in sorted(b for b in self._acks_pending if b <= acked):
                        for rank, kinds in self._acks_pending.pop(n).items():
                            state = self.copy_states.get(rank)
                            if state is not None:
                                state.set(post=kinds.get("post"), mid=kinds.get("mid"))

    # -- the orchestrator's node: watched, and taken over when it is lost --------------------

    def _watch_orchestrator_node(self):
        """Hold a ``watch`` connection to the peer server of the node that runs the orchestrator;
        its end without a ``bye`` is that node's loss (its TCPStore and orchestrator went with it)."""
        while not self.done:
            node, target = self.orch_node, self.orch_peer
            if node is None or node == self.node_rank or not target:
                time.sleep(0.1)
                continue
            failed_since = None
            sock = None
            while sock is None and not self.done and (self.orch_node, self.orch_peer) == (node, target):
                try:
                    host, port = target.rsplit(":", 1)
                    sock = socket.create_connection((host, int(port)), timeout=NODE_TIMEOUT_S)
                    _keepalive(sock)
                    sock.sendall(json.dumps({"op": "hello", "token": self.token, "node": self.node_rank,
                                             "kind": "watch"}).encode() + b"\n")
                except OSError:
                    sock = None
                    failed_since = failed_since or time.monotonic()
                    if time.monotonic() - failed_since > NODE_TIMEOUT_S:
                        break
                    time.sleep(0.1)
            bye = None
            if sock is not None:
                sock.settimeout(None)
                data = b""
                with contextlib.suppress(OSError):
                    while chunk := sock.recv(1 << 10):
                        data += chunk
                sock.close()
                with contextlib.suppress(ValueError):
                    bye = json.loads(data.splitlines()[0]) if data.strip() else None
            if self.done or (self.orch_node, self.orch_peer) != (node, target):
                continue
            self.events.put(("orchestrator_node_lost", node, bye))
            while not self.done and (self.orch_node, self.orch_peer) == (node, target):
                time.sleep(0.1)

    def _orchestrator_node_lost(self, node: int, bye: dict | None):
        if self.done or self.done_requested or node != self.orch_node:
            return
        if bye is not None:
            if int(bye.get("code", 1)) != 0:
                self._give_up(f"node {node}, which runs the orchestrator, stopped the job (status {bye['code']})",
                              int(bye["code"]))
            return
        successors = [s for s in self.succession if s["node"] != node]
        if not successors:
            self._give_up(f"node {node}, which ran the job's orchestrator and store, was lost, and no other node "
                          "was named to take over (a single-node job, or lost before the job started)")
            return
        first = successors[0]
        self.orch_node, self.orch_peer = first["node"], None
        if first["node"] == self.node_rank:
            self._take_over(node)
        else:
            self.log(f"node {node}, which ran the orchestrator, was lost; node {first['node']} takes over")
            self._move_orchestrator(first["standby"])
            self.takeover_wait = time.monotonic()

    def _take_over(self, lost: int):
        """Run the job's orchestrator here, resumed from the journal the lost one sent this node,
        with a fresh store for the groups' next generations (the job's store died with ``lost``)."""
        import torch.distributed as dist

        if self.journal is None:
            self._give_up(f"node {lost}, which ran the orchestrator, was lost before it sent this node its journal")
            return
        self.log(f"node {lost}, which ran the orchestrator and the job's store, was lost; taking over")
        self.store = dist.TCPStore("0.0.0.0", 0, None, True, wait_for_workers=False)  # noqa: S104 (every node's ranks)
        self.store_addr = f"{self.advertise}:{self.store.port}"
        jobdir.write_json(os.path.join(jobdir.job_dir(self.job, create=True), "state.json"), self.journal)
        port = self.standby.getsockname()[1]
        self.standby.close()
        self.standby = None
        self._move_orchestrator(f"{self.advertise}:{port}", connect=False)
        self._start_orchestrator(resume=True, takeover_from=lost)
        self._drop_connection()

    def _move_orchestrator(self, addr: str, connect: bool = True):
        self.orch_addr = addr
        self._publish_orchestrator()
        if connect:
            self._drop_connection()

    def _drop_connection(self):
        with self._send_lock:
            self._drop()

    def _give_up(self, why: str, code: int = 1):
        """The job cannot go on: stop this node's workers and end with ``code``, as torchrun's
        agents do when their rendezvous host is gone."""
        self.log(f"job {self.job} failed: {why}")
        self.exit_code = code
        self._kill_all()
        self.done = True

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
        elif op == "shadow":
            if self._spares_left() <= 0:
                self.send({"op": "spawn_failed", "req": req, "error": "no spare left on this node"})
                return
            rank = int(msg["rank"])
            old = self.shadows.pop(rank, None)
            if old is not None:  # replaced: it must not linger as a second process of the rank
                with contextlib.suppress(ProcessLookupError):
                    old.popen.kill()
            local_rank = self.next_spare_slot
            self.next_spare_slot += 1
            self.spares_used += 1
            proc = self._spawn(rank, local_rank, "replacement", int(msg["generation"]), msg["incarnation"], shadow=True)
            self.send({"op": "shadow_spawned", "req": req, "rank": rank, "pid": proc.popen.pid,
                       "spares": self._spares_left()})
        elif op == "adopt":
            # The rank was lost: its shadow becomes its process (its exits are the rank's now).
            rank = int(msg["rank"])
            proc = self.shadows.get(rank)
            if proc is None or proc.incarnation != msg.get("incarnation") or proc.popen.poll() is not None:
                self.send({"op": "adopt_failed", "req": req, "rank": rank})
                return
            del self.shadows[rank]
            self._new_incarnation(rank)
            self.procs[rank] = proc
            self.send({"op": "adopted", "req": req, "rank": rank, "pid": proc.popen.pid})
        elif op == "peers":
            self.holder_addr = msg.get("holder")
            self._holder_changed.set()
            self.succession = list(msg.get("succession", []))
            self.store_addr = msg.get("store") or self.store_addr
            self.orch_node, self.orch_peer = msg.get("orchestrator_node"), msg.get("orchestrator_peer") or None
        elif op == "journal":
            self.journal = msg["state"]
        elif op == "read_copy":
            rank = int(msg["rank"])
            self.send({"op": "state", "req": req, "rank": rank, "source": self.peer.copy_of(rank)})
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
            shadow = self.shadows.get(int(msg["rank"]))
            if shadow is not None and msg.get("incarnation") == shadow.incarnation:
                proc = self.shadows.pop(int(msg["rank"]))
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
        if join is not None:
            self.advertise = _local_address_towards(self.orch_addr.rsplit(":", 1)[0])
            self.orch_node = None  # learnt from the orchestrator's peers order
            self._start_peering()
        self.node_dir = self._node_dir()
        if self.peer is not None:
            self.written = offnode.Written(self.node_dir, create=True)
        self._publish_orchestrator()
        threading.Thread(target=self._connect_loop, daemon=True).start()
        if self.peer is not None:
            threading.Thread(target=self._forward_state, name="lockstep-copies", daemon=True).start()
            threading.Thread(target=self._watch_orchestrator_node, name="lockstep-watch", daemon=True).start()
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
        code = 1
        try:
            code = self._loop()
            return code
        finally:
            if self.peer is not None:
                self.peer.bye(code)
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
            if self.takeover_wait is not None and now - self.takeover_wait > TAKEOVER_TIMEOUT_S:
                self._give_up(f"the orchestrator's node was lost and its successor did not answer at {self.orch_addr} "
                              f"within {TAKEOVER_TIMEOUT_S:.0f} s (lost too?)")
                continue
            if now - last_beat >= HEARTBEAT_S:
                last_beat = now
                self.send({"op": "heartbeat", "spares": self._spares_left(),
                           "ranks": {str(p.rank): p.popen.pid for p in self.procs.values() if p.popen.poll() is None}})
            if ev is None:
                continue
            kind = ev[0]
            if kind == "child_exit":
                _, proc, code = ev
                if self.shadows.get(proc.rank) is proc:
                    del self.shadows[proc.rank]
                    self.send({"op": "shadow_exited", "rank": proc.rank, "incarnation": proc.incarnation,
                               "returncode": code})
                elif self.procs.get(proc.rank) is proc or proc.expected_exit:
                    self.send({"op": "exited", "rank": proc.rank, "pid": proc.popen.pid, "incarnation": proc.incarnation,
                               "returncode": code, "signal": -code if code < 0 else None,
                               "expected": proc.expected_exit})
            elif kind == "orch":
                self._order(ev[1])
            elif kind == "orchestrator_node_lost":
                self._orchestrator_node_lost(ev[1], ev[2])
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
