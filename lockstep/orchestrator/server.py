"""The job's orchestrator: one process per job, started by the leader node's ``lockstep run``.

Where it runs and how it survives its own restart: it is a child of the leader node's
supervisor (node 0's ``lockstep run``), which also hosts the job's TCPStore, and it keeps its
state in a journal (``jobdir``) rewritten atomically after every change, and sent to the
supervisors of its first ``JOURNAL_COPIES`` successors. If it dies, the
supervisor starts it again with ``--resume`` on the same port; every rank's control thread and
every node supervisor reconnect and say ``hello`` again with what they know (generation, step,
phase), so the orchestrator rebuilds its view from the journal plus those hellos. A recovery
that was under way is started again from its beginning (freezing the groups a second time is
harmless: the ranks report the same progress). Training never waits on the orchestrator; while
it is down the job runs, and a failure in that window is handled once it is back (the
supervisors keep the dead rank's exit and shared-memory state until then). The journal also
names the nodes and who holds whose copies, so a node that dies while this process is down is
declared lost once the restarted one has waited ``RESUME_GRACE_S`` plus the node timeout for its
hello, and its ranks are replaced from the copies its holder kept.

Copies of the small state, peer to peer: every node's supervisor sends its ranks' small state
(RNG, buffers, data positions; ``runtime/smallstate``) as it is written straight to the
supervisor of the next alive node of a ring (``core.ring``; the ``peers`` order names it), which
keeps it in memory and acknowledges each batch: this process never carries it, and the copies
outlive its restarts.

How old a lost node's copies can be, and the recovery rule: a replacement resumes at the
boundary of its rank's newest held copy, ``post(a)``, and the survivors redo at most the step in
flight -- ``core.plan_recovery`` needs ``a >= S - 1`` for the slowest survivor's step ``S``
(a survivor still short of ``a`` is waited for; when all are past it, the replacement redoes
step ``a + 1`` inexactly, its RNG and buffers pinned from the copy of ``mid(a)``, and re-syncs
at the next boundary). Nothing rolls back: a
survivor keeps no older parameters. The copies are made current enough instead: a rank holds
its first gradient collective of step ``k + 1`` -- the point after which the survivors can
finish that step -- until its supervisor says the holder has ``post(k)`` (and ``mid(k)`` when the
forward pass changed its buffers): ``runtime/offnode``. The copy was sent a forward pass
earlier, so the rank almost never waits; a slow forwarder, network or holder slows the job
instead of making a loss unrecoverable. A node lost therefore leaves every rank's state at most
the step in flight old, and when the rule cannot hold (a script whose gradients do not go
through DDP's buckets: no gate) the recovery fails saying so, never a wrong result.

How the job survives the loss of this process's node (its supervisor, this process and the
job's TCPStore die together): the ring read from the node after this one is the *succession*,
sent to every supervisor with each node's *standby* address (a port its supervisor reserved at
start). Every other supervisor holds a ``watch`` connection to this node's supervisor
(``node.PeerServer``); its closing without a ``bye`` (the process died) or its keep-alive
failing (the host died) is the node's loss. The first successor -- which holds the lost node's
copies and the journal -- starts a TCPStore and an orchestrator of its own on its standby port
with ``--takeover-from``; the others reconnect there (their ranks follow through a file in the
node directory), and the orchestrator loses the old node's ranks as in any node loss: survivors
freeze, spares replace them from the copies, every group's next generation is built in the new
store (``rebuild`` carries its address; replacements get it as ``MASTER_ADDR``). Where this
cannot be survived -- a single-node job, no successor named yet, a successor that does not answer
within ``node.TAKEOVER_TIMEOUT_S``, no spare, no replica -- every node's supervisor stops its
workers and exits 1 with the reason, as torchrun's agents do when their rendezvous host is gone.

Losses it handles: a rank killed (its supervisor's ``waitpid``), several at once, a loss while
a recovery is under way (the recovery starts over with every rank lost so far and retires the
replacements it had started; spares permitting), and a whole node: a supervisor silent for
``LOCKSTEP_NODE_TIMEOUT_S`` (1.5 s; on this host, silent with its connection closed) loses
all its ranks, which are replaced from the copies of their small state its holder kept; the
loss of this process's own node is survived by a takeover (above).

Shadows (local scheduler): a replacement re-runs the script's control flow from the start, so
its fast-forward grows with the step a rank is lost at. A node with a spare for each of its
ranks and one more therefore starts, with ``LOCKSTEP_SHADOWS=1``, a shadow per rank
(``_tend_shadows``): a replacement with ``ff_limit`` but no ``resume_at`` -- the proactive migration's follow mode, open-ended -- that
the rank's newest small state and a new limit reach every ``SHADOW_FOLLOW_S``. Its supervisor
keeps it apart from the rank's process (``shadow`` / ``adopt`` orders) and starts it at idle
CPU priority. When the rank is lost, the recovery adopts the shadow instead of starting a spare
(``_adopt_shadow``: the same plan as a fresh replacement's, so it fast-forwards the few steps
left and resumes as any other); a shadow that diverged, died, moved node or is ahead of the
boundary is dropped and a spare used. A proactive migration does not use it. Shadows are not in
the journal: after a restart of this process they are told they are no longer wanted, and
replaced.

Its connections (newline-delimited JSON): TCP from ranks and node supervisors (a hello carries
the job token), and a Unix socket in the job directory for the CLI (``status``, ``migrate``,
``hold``/``release``; the command registry ``COMMANDS`` is where ``snapshot``/``restore`` plug in).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import itertools
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from lockstep.events import AgentEvents
from lockstep.orchestrator import core, jobdir
from lockstep.orchestrator.events import AGENT_KINDS

RECOVERY_TIMEOUT_S = float(os.environ.get("LOCKSTEP_RECOVERY_TIMEOUT_S", "180"))
NODE_TIMEOUT_S = float(os.environ.get("LOCKSTEP_NODE_TIMEOUT_S", "1.5"))
HEARTBEAT_EVENT_S = float(os.environ.get("LOCKSTEP_HEARTBEAT_EVENT_S", "5"))
# After a restart, how long a node of the journal has to say hello again before its silence counts
# (its supervisor retries every 0.2 s; this process takes about a second to start).
RESUME_GRACE_S = float(os.environ.get("LOCKSTEP_RESUME_GRACE_S", "2"))
# Ranks per job.heartbeat event: 256 rows are ~20 KiB, well inside the agent socket's 64 KiB line.
HEARTBEAT_RANKS_PER_EVENT = 256
DEBUG = bool(os.environ.get("LOCKSTEP_DEBUG"))
# Shadows (the module's docstring): opt-in, since where the spares share the ranks' cores (one
# host) following costs the ranks CPU (bench/goodput).
SHADOWS = os.environ.get("LOCKSTEP_SHADOWS", "0") == "1"
SHADOW_FOLLOW_S = float(os.environ.get("LOCKSTEP_SHADOW_FOLLOW_S", "2"))
SHADOW_MIN_STEP = 8  # past the steps a replacement runs for real (replay.REAL_STEPS) and DDP's bucket rebuild
SHADOW_RETRY_S = 30.0  # after a shadow that could not start or died
SHADOW_MARK = ":shadow:"  # in a shadow's incarnation
# How many successors get the journal (the first takes over; the second covers a successor lost
# since the last change).
JOURNAL_COPIES = 2
LINE_LIMIT = 256 << 20  # a lost rank's state (buffers included) travels in one line

COMMANDS: dict = {}


def command(name):
    """Register a CLI command: ``async def handler(orchestrator, msg) -> dict``."""

    def deco(fn):
        COMMANDS[name] = fn
        return fn

    return deco


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer
        self.role = None
        self.closed = False

    def send(self, msg: dict):
        if self.closed:
            return
        try:
            self.writer.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        except (ConnectionError, RuntimeError):
            self.closed = True


@dataclass
class RankInfo:
    rank: int
    node: int | None = None
    conn: Conn | None = None
    state_addr: str | None = None
    incarnation: str | None = None
    pid: int | None = None
    step: int = 0
    step_time_s: float = 0.0
    phase: str = "live"
    status: str = "starting"
    holding_at: int | None = None
    report: dict | None = None
    events: dict = field(default_factory=dict)

    def public(self) -> dict:
        return {"rank": self.rank, "node": self.node, "status": self.status, "step": self.step,
                "step_time_s": self.step_time_s, "phase": self.phase, "pid": self.pid}


@dataclass
class NodeInfo:
    node: int
    conn: Conn | None = None
    host: str = ""
    spares: int = 0
    alive: bool = True
    last_seen: float = 0.0
    nproc: int = 0
    peer: str = ""  # its supervisor's peer server (copies of other nodes' small state, the leader watch)
    standby: str = ""  # the address an orchestrator it starts on taking over listens at


class Orchestrator:
    def __init__(self, *, job: str, token: str, world_size: int, nnodes: int, scheduler_name: str,
                 host: str, port: int, resume: bool, node: int = 0, takeover_from: int | None = None,
                 store: str | None = None):
        self.job = job
        self.token = token
        self.world_size = world_size
        self.nnodes = nnodes
        self.host = host
        self.port = port
        self.dir = jobdir.job_dir(job, create=True)
        self.ranks = {r: RankInfo(r) for r in range(world_size)}
        self.nodes: dict[int, NodeInfo] = {}
        self.generation = 0
        self.problems: list[str] = []
        self.history: list[dict] = []
        self.spares_used = 0
        self.events = AgentEvents()
        self.scheduler_name = scheduler_name
        self.scheduler = None
        self._req = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None  # the recovery or migration under way
        self._task_kind = None
        self._lost_queue: set[int] = set()
        self.shadows: dict[int, RankInfo] = {}
        self._shadow_next: dict[int, float] = {}  # rank -> when its shadow is next started or told to go on
        self._shadow_busy: set[int] = set()  # ranks with a shadow request under way
        self._no_shadow: set[int] = set()  # ranks whose shadow diverged: their control flow depends on values
        self.node = node  # the node whose supervisor runs this process
        self.takeover_from = takeover_from  # the lost node whose orchestrator this one replaces
        # Where the ranks build their groups' next generation (None: the job's own store, on node
        # 0; a host:port once an orchestrator took over from a lost node 0, hosted by its node).
        self.store_addr = store
        # node -> the node whose supervisor holds the copies of its ranks' small state (core.ring);
        # a lost node keeps the holder it had when it died.
        self.holders: dict[int, int] = {}
        self._done = asyncio.Event()
        self.exit_code = 0
        self.failure: str | None = None
        self.started = time.time()
        if resume:
            self._load_journal()

    # -- journal ---------------------------------------------------------------------------

    def _journal(self):
        data = {
            "job": self.job, "generation": self.generation, "world_size": self.world_size,
            "nnodes": self.nnodes, "problems": self.problems, "spares_used": self.spares_used,
            "ranks": {str(r.rank): r.public() | {"incarnation": r.incarnation} for r in self.ranks.values()},
            "history": self.history[-50:], "recovering": self._task_kind,
            "lost_pending": sorted(self._lost_queue),
            "nodes": {str(n.node): {"host": n.host, "alive": n.alive, "peer": n.peer, "standby": n.standby,
                                    "holder": self.holders.get(n.node)} for n in self.nodes.values()},
            "store": self.store_addr, "orchestrator_node": self.node,
        }
        jobdir.write_json(os.path.join(self.dir, "state.json"), data)
        # The successors keep it too: one of them resumes from it if this node is lost.
        for n in self._succession()[:JOURNAL_COPIES]:
            node = self.nodes[n]
            if node.conn is not None:
                node.conn.send({"op": "journal", "state": data})

    def _load_journal(self):
        data = jobdir.read_json(os.path.join(self.dir, "state.json"))
        if not data:
            return
        self.generation = int(data.get("generation", 0))
        self.problems = list(data.get("problems", []))
        self.spares_used = int(data.get("spares_used", 0))
        self.history = list(data.get("history", []))
        if self.store_addr is None:
            self.store_addr = data.get("store")
        for key, info in data.get("ranks", {}).items():
            r = self.ranks.get(int(key))
            if r is not None:
                r.status = info.get("status", "starting")
                r.node = info.get("node")
                r.step = info.get("step", 0)
                r.incarnation = info.get("incarnation")
        # The nodes known before the restart: one that never says hello again (it died while this
        # process was down) is lost like one that fell silent, after the reconnect grace.
        grace = time.monotonic() + RESUME_GRACE_S
        known = data.get("nodes", {})
        for n in range(self.nnodes):
            info = known.get(str(n), {})
            self.nodes[n] = NodeInfo(n, host=info.get("host", ""), alive=bool(info.get("alive", True)), last_seen=grace,
                                     peer=info.get("peer", ""), standby=info.get("standby", ""))
            if info.get("holder") is not None:
                self.holders[n] = int(info["holder"])
        pending = set(data.get("lost_pending", []))
        if data.get("recovering"):
            pending |= {r.rank for r in self.ranks.values() if r.status in ("lost", "recovering")}
        self._lost_queue = pending

    def _event(self, kind: str, data: dict):
        data = {"job": self.job, **data}
        if kind in AGENT_KINDS:
            self.events.emit(kind, data)
        self.history.append({"ts": time.time(), "kind": kind, **data})

    # -- serving ---------------------------------------------------------------------------

    async def serve(self):
        from lockstep.schedulers import get_scheduler

        self.scheduler = get_scheduler(self.scheduler_name, self)
        tcp = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True, limit=LINE_LIMIT)
        self.port = tcp.sockets[0].getsockname()[1]
        sock_path = os.path.join(self.dir, "control.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock_path)
        unix = await asyncio.start_unix_server(self._handle_cli, sock_path, limit=LINE_LIMIT)
        os.chmod(sock_path, 0o600)
        jobdir.write_json(os.path.join(self.dir, "job.json"), {
            "job": self.job, "orchestrator": f"{self.host}:{self.port}", "pid": os.getpid(),
            "world_size": self.world_size, "nnodes": self.nnodes, "started": self.started,
            "scheduler": self.scheduler_name})
        self._journal()
        print(f"READY {self.port}", flush=True)
        ticker = asyncio.create_task(self._tick())
        from lockstep.orchestrator import snapshots  # registers its commands; the periodic schedule

        snapshots.start_schedule(self)
        if self.takeover_from is not None:
            lost = self.takeover_from
            self._event("job.orchestrator_moved", {"from_node": lost, "to_node": self.node, "store": self.store_addr})
            print(f"lockstep: node {self.node} took over the orchestrator of lost node {lost}", file=sys.stderr, flush=True)
            self._node_lost(lost, f"node {lost}, which ran the orchestrator, was lost; node {self.node} took over")
        elif self._lost_queue:
            asyncio.get_running_loop().call_later(2.0, self._kick_recovery)
        async with tcp, unix:
            await self._done.wait()
            await asyncio.sleep(0.2)  # let the last messages drain
        ticker.cancel()
        return self.exit_code

    async def _tick(self):
        last_event = 0.0
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            # A node is lost when its supervisor is silent: on another host, for any reason; on
            # this one, only once its connection has closed too (a dead process closes it, while
            # a busy machine must not be mistaken for a dead one).
            me = socket.gethostname()
            watched = {k: v.last_seen for k, v in self.nodes.items()
                       if v.alive and (v.host != me or v.conn is None or v.conn.closed)}
            for n in core.lost_nodes(watched, now, NODE_TIMEOUT_S):
                self._node_lost(n, f"node {n}'s supervisor silent for {NODE_TIMEOUT_S:.1f} s")
            self._tend_shadows(now)
            for node in self.nodes.values():
                if node.conn is not None:
                    with contextlib.suppress(Exception):
                        await node.conn.writer.drain()
            if now - last_event >= HEARTBEAT_EVENT_S:
                last_event = now
                rows = [{"rank": r.rank, "step": r.step, "step_time_s": r.step_time_s, "node": r.node,
                         "state": r.status} for r in self.ranks.values()]
                for part in core.heartbeat_parts(rows, HEARTBEAT_RANKS_PER_EVENT):
                    self.events.emit("job.heartbeat", {
                        "job": self.job, "generation": self.generation, "world_size": self.world_size,
                        "ranks": part})

    async def _read_lines(self, conn: Conn):
        while True:
            line = await conn.reader.readline()
            if not line:
                return
            try:
                yield json.loads(line)
            except ValueError:
                return

    async def _handle(self, reader, writer):
        conn = Conn(reader, writer)
        info = None
        try:
            async for msg in self._read_lines(conn):
                if info is None:
                    if msg.get("op") != "hello" or not hmac.compare_digest(str(msg.get("token", "")), self.token):
                        conn.send({"op": "error", "error": "hello with the job token expected"})
                        return
                    info = self._hello(conn, msg)
                    continue
                if conn.role == "supervisor":
                    self._from_node(info, msg)
                else:
                    self._from_rank(info, conn, msg)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        except Exception:  # a bug in a handler: say so, drop this connection (it reconnects)
            import traceback

            traceback.print_exc()
        finally:
            conn.closed = True
            with contextlib.suppress(Exception):
                writer.close()
            if conn.role == "supervisor" and info is not None and info.conn is conn or isinstance(info, RankInfo) and info.conn is conn:
                info.conn = None

    def _hello(self, conn: Conn, msg: dict):
        role = msg.get("role")
        if DEBUG:
            print(f"lockstep[debug]: hello {role} {msg.get('rank', msg.get('node'))} {msg.get('incarnation', '')}",
                  file=sys.stderr, flush=True)
        conn.role = role
        if role == "supervisor":
            n = int(msg["node"])
            node = self.nodes.setdefault(n, NodeInfo(n))
            node.conn = conn
            node.host = msg.get("host", "")
            node.spares = int(msg.get("spares", 0))
            node.nproc = int(msg.get("nproc", 0))
            node.peer = msg.get("peer", "")
            node.standby = msg.get("standby", "")
            node.alive = True
            node.last_seen = time.monotonic()
            for r, pid in msg.get("ranks", {}).items():
                info = self.ranks[int(r)]
                info.node = n
                info.pid = pid
            for ex in msg.get("exits", []):
                self._from_node(node, dict(ex, op="exited"))
            self._send_peers()
            self._journal()  # a successor that reconnects gets the journal at once
            self._changed.set()
            return node
        rank = int(msg["rank"])
        shadow = self.shadows.get(rank)
        if role == "replacement" and shadow is not None and msg.get("incarnation") == shadow.incarnation:
            shadow.conn = conn
            shadow.state_addr = msg.get("state_addr")
            shadow.pid = msg.get("pid")
            shadow.step = int(msg.get("step", 0))
            conn.send(dict(shadow.events["plan"], op="plan"))
            return shadow
        info = self.ranks[rank]
        stale_shadow = SHADOW_MARK in str(msg.get("incarnation")) and msg.get("incarnation") != info.incarnation
        if role == "replacement" and (stale_shadow or info.incarnation not in (None, msg.get("incarnation")) and
                                      info.events.get("expected_incarnation") not in (None, msg.get("incarnation"))):
            conn.send({"op": "fail", "message": "this replacement is no longer wanted"})
            return RankInfo(rank, status="stale")  # what it says until it exits is not the rank's
        info.conn = conn
        info.state_addr = msg.get("state_addr")
        info.incarnation = msg.get("incarnation")
        info.pid = msg.get("pid")
        info.step = int(msg.get("step", 0))
        info.phase = msg.get("phase", "live")
        if info.status in ("starting",) and role == "worker":
            info.status = "running"
            self._journal()  # a restarted orchestrator must know it runs (and where) to lose it with its node
        plan = info.events.get("plan")
        if role == "replacement" and plan:
            conn.send(dict(plan, op="plan"))
        if role == "worker" and "freeze" in info.events and info.report is None:
            conn.send(info.events["freeze"])  # a recovery started before this rank connected
        self._changed.set()
        return info

    def _from_rank(self, info: RankInfo, conn: Conn, msg: dict):
        op = msg.get("op")
        if info.status == "stale":
            return
        if info.status == "shadow":
            self._from_shadow(info, msg)
            return
        if DEBUG and op != "heartbeat":
            print(f"lockstep[debug]: rank {info.rank} -> {str(msg)[:300]}", file=sys.stderr, flush=True)
        if op == "heartbeat":
            info.step = int(msg.get("step", info.step))
            info.step_time_s = float(msg.get("step_time_s", info.step_time_s))
            info.phase = msg.get("phase", info.phase)
            return
        if op == "unprotected":
            reason = f"rank {info.rank}: {msg.get('reason')}"
            if reason not in self.problems:
                self.problems.append(reason)
                print(f"lockstep: job {self.job} is not protected from hard failures: {reason}", file=sys.stderr, flush=True)
                self._journal()
            return
        if op == "diverged":
            self.fail(f"replacement for rank {info.rank} diverged: {msg.get('message')}")
            return
        if op == "exit":
            info.events["exit_code"] = msg.get("code")
            return
        info.events[op] = msg
        if op == "holding":
            info.holding_at = info.step = int(msg["boundary"])
        if op == "hold_missed":  # fresher than the last heartbeat: the next boundary is chosen from it
            info.step = max(info.step, int(msg.get("step", info.step)))
        if op == "report":
            info.report = msg
        if op in ("ff_progress", "resumed", "live"):
            info.step = int(msg.get("step", info.step))
            info.phase = {"resumed": "replay", "live": "live"}.get(op, "ff")
        self._changed.set()

    def _from_node(self, node: NodeInfo, msg: dict):
        op = msg.get("op")
        node.last_seen = time.monotonic()
        if op == "heartbeat":
            node.spares = int(msg.get("spares", node.spares))
            for r, pid in msg.get("ranks", {}).items():
                info = self.ranks[int(r)]
                if info.status not in ("lost", "recovering", "migrating"):
                    info.node, info.pid = node.node, pid
            return
        if "req" in msg:
            fut = self._pending.pop(int(msg["req"]), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            if op == "spawned":
                info = self.ranks[int(msg["rank"])]
                info.pid = msg.get("pid")
                info.node = node.node
            return
        if op == "exited":
            self._rank_exited(node, msg)
        elif op == "shadow_exited":
            shadow = self.shadows.get(int(msg["rank"]))
            if shadow is not None and shadow.incarnation == msg.get("incarnation"):
                del self.shadows[shadow.rank]
                self._shadow_next[shadow.rank] = time.monotonic() + SHADOW_RETRY_S

    # -- the ring of copies and the succession -----------------------------------------------

    def _unconnected(self) -> list[int]:
        return [n.node for n in self.nodes.values() if n.alive and n.conn is None]

    def _succession(self) -> list[int]:
        return core.ring([n.node for n in self.nodes.values() if n.alive], self.node)[1]

    def _send_peers(self):
        """Tell every node's supervisor where to send its ranks' copies, which node runs this
        process (to watch it), who takes over if that node is lost (its standby address) and
        where the store is. A lost node's holder stays as it was: its copies are there."""
        alive = [n.node for n in self.nodes.values() if n.alive and n.peer]
        holders, succession = core.ring(alive, self.node)
        self.holders.update(holders)
        me = self.nodes.get(self.node)
        msg = {"op": "peers", "orchestrator_node": self.node, "orchestrator_peer": me.peer if me else "",
               "succession": [{"node": n, "standby": self.nodes[n].standby} for n in succession],
               "store": self.store_addr}
        for n in alive:
            node = self.nodes[n]
            if node.conn is not None:
                holder = holders.get(n)
                node.conn.send(dict(msg, holder=self.nodes[holder].peer if holder is not None else None))

    # -- node requests ---------------------------------------------------------------------

    async def node_request(self, node: int, msg: dict, timeout: float = 30.0) -> dict:
        n = self.nodes.get(node)
        if n is None or n.conn is None:
            raise core.Unrecoverable(f"node {node} is not connected")
        req = next(self._req)
        fut = asyncio.get_running_loop().create_future()
        self._pending[req] = fut
        n.conn.send(dict(msg, req=req))
        return await asyncio.wait_for(fut, timeout)

    def send_nodes(self, msg: dict):
        for n in self.nodes.values():
            if n.conn is not None:
                n.conn.send(msg)

    def send_rank(self, rank: int, msg: dict):
        info = self.ranks[rank]
        if info.conn is not None:
            info.conn.send(msg)

    # -- exits and losses ------------------------------------------------------------------

    def _rank_exited(self, node: NodeInfo, msg: dict):
        rank = int(msg["rank"])
        info = self.ranks[rank]
        info.node = node.node
        if msg.get("incarnation") and info.incarnation and msg["incarnation"] != info.incarnation:
            # An old incarnation (a rank replaced already, or a replacement abandoned).
            return
        kind = core.classify_exit(msg.get("returncode"), msg.get("signal"), bool(msg.get("expected")))
        if kind == "migrated":
            return
        if info.status == "migrating":
            # The replacement of a proactive migration died: the migration fails, the job does not.
            if self._task is not None and not self._task.done():
                self._task.cancel()
            return
        if kind == "finished":
            info.status = "finished"
            self._journal()
            self._changed.set()
            if all(r.status == "finished" for r in self.ranks.values()):
                self.send_nodes({"op": "done"})
                self._done.set()
            return
        if kind == "failed":
            info.status = "failed"
            self.fail(f"rank {rank} exited with status {msg.get('returncode')} (the script failed; "
                      "a replacement would fail the same way)", code=1)
            return
        sig = msg.get("signal")
        self._lose([rank], f"rank {rank} (pid {msg.get('pid')}) was killed by signal {sig}")

    def _node_lost(self, n: int, why: str):
        node = self.nodes[n]
        if not node.alive:
            return
        node.alive = False
        ranks = [r.rank for r in self.ranks.values() if r.node == n and r.status in ("starting", "running", "recovering")]
        self._send_peers()
        self._lose(ranks, why)

    def _lose(self, ranks: list[int], why: str):
        ranks = [r for r in ranks if self.ranks[r].status not in ("finished", "failed")]
        if not ranks:
            return
        for r in ranks:
            info = self.ranks[r]
            info.status = "lost"
            info.conn = None
            self._event("job.rank_lost", {"rank": r, "node": info.node, "step": info.step, "cause": why})
        print(f"lockstep: {why}", file=sys.stderr, flush=True)
        self._lost_queue.update(ranks)
        self._journal()
        self._kick_recovery()

    def _kick_recovery(self):
        if not self._lost_queue:
            return
        if self._task is not None and not self._task.done():
            # A loss during a recovery or migration: start over, with every rank lost so far.
            self._task.cancel()
        self._task_kind = "recovery"
        self._task = asyncio.ensure_future(self._recover_guarded())

    def fail(self, message: str, code: int = 1):
        if self._done.is_set():
            return
        print(f"lockstep: job {self.job} failed: {message}", file=sys.stderr, flush=True)
        self.failure = message
        self._event("job.failed", {"message": message})
        self.exit_code = code
        for r in self.ranks.values():
            if r.conn is not None:
                r.conn.send({"op": "fail", "message": message})
        self.send_nodes({"op": "terminate", "code": code, "message": message})
        self._journal()
        self._done.set()

    # -- waiting ---------------------------------------------------------------------------

    async def wait_until(self, predicate, what: str, timeout: float = RECOVERY_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise core.Unrecoverable(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))

    # -- hard-failure recovery -------------------------------------------------------------

    async def _recover_guarded(self):
        try:
            await self._recover()
        except asyncio.CancelledError:
            raise
        except core.Unrecoverable as exc:
            self.fail(f"cannot recover: {exc}")
        except Exception as exc:  # a bug must not leave the job hanging
            import traceback

            traceback.print_exc()
            self.fail(f"recovery failed: {exc!r}")

    async def _recover(self):
        t0 = last = time.monotonic()
        phases: dict[str, float] = {}  # where the time to resumed training went

        def phase(name: str):
            nonlocal last
            now = time.monotonic()
            phases[name] = round(now - last, 3)
            last = now
        lost = sorted(self._lost_queue)
        if self.problems:
            raise core.Unrecoverable("the job is not protected: " + "; ".join(self.problems))
        old_gen = self.generation
        gen = max(self.generation, max((int(r.events.get("plan", {}).get("generation", 0))
                                        for r in self.ranks.values()), default=0)) + 1
        survivors = [r for r in self.ranks.values()
                     if r.rank not in lost and r.status in ("starting", "running", "recovering")]
        if not survivors:
            raise core.Unrecoverable("every rank was lost: no data-parallel replica holds the model state")
        # After a restart or a takeover the supervisors reconnect first: they hold the lost ranks'
        # copies and the spares (a node that never does is declared lost meanwhile).
        await self.wait_until(lambda: all(n.conn is not None or not n.alive for n in self.nodes.values()),
                              lambda: f"the supervisors of nodes {self._unconnected()} to reconnect")
        phase("supervisors")
        for r in lost:
            self.ranks[r].status = "recovering"
            self._event("job.migration_started", {"rank": r, "reason": "failure", "from_node": self.ranks[r].node})
        for s in survivors:
            s.report = None
            s.events.pop("rebuilt", None)
            s.status = "recovering"
            s.events["freeze"] = {"op": "freeze", "generation": old_gen, "lost": lost}
            self.send_rank(s.rank, s.events["freeze"])
        # A recovery started over: the replacements the interrupted one started must not join a
        # group, nor write the rank's state while it is read.
        for r in lost:
            await self._retire_replacement(r)
        # The lost ranks' small state, from the shared memory of their nodes.
        sources = {}
        for r in lost:
            sources[r] = await self._read_source(r)
        phase("read_state")
        # Replacements: the rank's shadow where it has one, else a spare each, started now (they
        # fast-forward while the survivors report).
        shadowed = {}
        for r in lost:
            shadowed[r] = await self._adopt_shadow(r, gen, sources[r])
            if shadowed[r] is None:
                await self._start_replacement(r, gen, sources[r], resume_at=_post_step(sources[r]))
        phase("start_replacements")
        # A survivor that has not connected yet gets the freeze order when it says hello.
        await self.wait_until(lambda: all(s.report is not None for s in survivors), "the survivors' progress reports")
        phase("survivor_reports")
        reports = []
        for s in survivors:
            reports.append(core.SurvivorReport(
                s.rank, int(s.report["step_no"]),
                {g: core.GroupProgress.from_report(p) for g, p in s.report["groups"].items()},
                s.state_addr or "", bool(s.report.get("holding"))))
        plan = core.plan_recovery(gen, reports, {r: _post_step(sources[r]) for r in lost})
        for s in survivors:
            s.events.pop("rebuilt", None)
            self.send_rank(s.rank, self._rebuild_order(gen, plan))
        for r in lost:
            self._update_plan(r, {"live_after": plan.live_after, "donors": plan.donors[r], "generation": gen,
                                  "resume_at": plan.resume_at[r], "rerun_from_seq": plan.rerun_from_seq})
        await self.wait_until(
            lambda: all("rebuilt" in s.events for s in survivors) and all("resumed" in self.ranks[r].events for r in lost),
            lambda: "the group to re-form (not rebuilt: ranks {}; not resumed: ranks {})".format(
                [s.rank for s in survivors if "rebuilt" not in s.events],
                [r for r in lost if "resumed" not in self.ranks[r].events]))
        phase("regroup")
        self.generation = gen
        resumed = time.monotonic() - t0
        for s in survivors:
            s.status = "running"
        await self.wait_until(lambda: all("live" in self.ranks[r].events for r in lost), "the replacements to go live")
        for r in lost:
            info = self.ranks[r]
            info.status = "running"
            self._event("job.migration_finished", {
                "rank": r, "reason": "failure", "ok": True, "to_node": info.node, "generation": gen,
                "failure_to_resumed_s": round(resumed, 3), "duration_s": round(time.monotonic() - t0, 3),
                "phases_s": phases, "resumed_at_step": plan.resume_at[r], "redo_steps": plan.redo_steps,
                "shadow_step": shadowed[r]})
            print(f"lockstep: rank {r} recovered in {resumed:.2f} s (training resumed at step "
                  f"{plan.resume_at[r]}), generation {gen}", file=sys.stderr, flush=True)
        self._lost_queue.difference_update(lost)
        self._task_kind = None
        self._journal()
        if self._lost_queue:
            self._kick_recovery()

    async def _read_source(self, rank: int) -> dict:
        """The rank's small state: from its node's shared memory, or, its node lost, from the
        copies its node's supervisor sent to the holder's."""
        info = self.ranks[rank]
        node = self.nodes.get(info.node) if info.node is not None else None
        if node is not None and node.alive and node.conn is not None:
            return (await self.node_request(info.node, {"op": "read_state", "rank": rank}))["source"]
        holder = self.holders.get(info.node) if info.node is not None else None
        if holder is None or holder == info.node or not self.nodes[holder].alive or self.nodes[holder].conn is None:
            raise core.Unrecoverable(f"rank {rank}'s node is gone and no copy of its per-rank state (RNG, data "
                                     "position) is left on another node")
        return (await self.node_request(holder, {"op": "read_copy", "rank": rank}))["source"]

    def _rebuild_order(self, gen: int, plan: core.RecoveryPlan) -> dict:
        return {"op": "rebuild", "generation": gen, "store": self.store_addr,
                "groups": {g: {"rerun_from_seq": n} for g, n in plan.rerun_from_seq.items()}}

    async def _retire_replacement(self, rank: int):
        info = self.ranks[rank]
        stale = info.events.get("expected_incarnation")
        node = self.nodes.get(info.node) if info.node is not None else None
        if stale and node is not None and node.alive and node.conn is not None:
            await self.node_request(info.node, {"op": "kill", "rank": rank, "incarnation": stale})

    async def _start_replacement(self, rank: int, gen: int, source: dict, resume_at: int | None,
                                 ff_limit: int | None = None):
        info = self.ranks[rank]
        incarnation = f"{self.job}-r{rank}-g{gen}-{os.urandom(3).hex()}"
        info.incarnation = incarnation
        info.events = {"expected_incarnation": incarnation}
        info.conn = None
        self._update_plan(rank, {"generation": gen, "source": source, "resume_at": resume_at, "ff_limit": ff_limit})
        launched = await self.scheduler.start_replacement(rank=rank, generation=gen, incarnation=incarnation,
                                                          lost_node=info.node)
        self.spares_used += 1
        info.node = launched.get("node", info.node)
        info.pid = launched.get("pid")
        self._journal()

    def _update_plan(self, rank: int, update: dict):
        self._send_plan(self.ranks[rank], update)

    @staticmethod
    def _send_plan(info: RankInfo, update: dict):
        plan = info.events.setdefault("plan", {})
        plan.update(update)
        if info.conn is not None:
            info.conn.send(dict(update, op="plan"))

    # -- shadows ---------------------------------------------------------------------------

    def _tend_shadows(self, now: float):
        """Starts the shadows the spares allow and tells each how far it may go (from ``_tick``)."""
        if not SHADOWS or self.scheduler_name != "local" or self.problems or self._done.is_set() or \
                (self._task is not None and not self._task.done()):
            return
        for info in self.ranks.values():
            r = info.rank
            if r in self._shadow_busy or now < self._shadow_next.get(r, 0.0):
                continue
            node = self.nodes.get(info.node) if info.node is not None else None
            if node is None or not node.alive or node.conn is None or info.status != "running":
                continue
            shadow = self.shadows.get(r)
            if shadow is None:
                # Only beside a spare for every rank of the node: a rank without a shadow is
                # still replaced from a spare.
                if r in self._no_shadow or info.phase != "live" or info.step < SHADOW_MIN_STEP or \
                        node.spares - 1 < max(1, node.nproc):
                    continue
                work = self._start_shadow(r, node.node)
            elif shadow.node != info.node:  # the rank moved (a migration): this one follows a history no longer there
                work = self._drop_shadow(r)
            elif shadow.conn is not None:
                work = self._follow_shadow(r, shadow)
            else:
                continue
            self._shadow_busy.add(r)
            asyncio.ensure_future(self._shadow_work(r, work))

    async def _shadow_work(self, rank: int, work):
        try:
            await work
        except (core.Unrecoverable, asyncio.TimeoutError, KeyError, ValueError, TypeError):
            shadow = self.shadows.get(rank)
            if shadow is not None and shadow.conn is None:  # its start failed part-way
                del self.shadows[rank]
            self._shadow_next[rank] = time.monotonic() + SHADOW_RETRY_S
        finally:
            self._shadow_busy.discard(rank)

    async def _start_shadow(self, rank: int, node: int):
        source = (await self.node_request(node, {"op": "read_state", "rank": rank}))["source"]
        if self.ranks[rank].status != "running" or _post_step(source) is None:
            return
        shadow = RankInfo(rank, node=node, incarnation=f"{self.job}-r{rank}{SHADOW_MARK}{os.urandom(3).hex()}",
                          status="shadow", phase="ff")
        shadow.events["plan"] = {"generation": self.generation, "source": source, "resume_at": None,
                                 "ff_limit": max(0, _post_step(source) - 1), "shadow": True}
        self.shadows[rank] = shadow  # before the order: its hello may come before the reply
        reply = await self.node_request(node, {"op": "shadow", "rank": rank, "generation": self.generation,
                                               "incarnation": shadow.incarnation})
        if reply.get("op") != "shadow_spawned":
            if self.shadows.get(rank) is shadow:
                del self.shadows[rank]
            self._shadow_next[rank] = time.monotonic() + SHADOW_RETRY_S
            return
        shadow.pid = reply.get("pid")
        self.nodes[node].spares = int(reply.get("spares", max(0, self.nodes[node].spares - 1)))
        self.spares_used += 1
        self._shadow_next[rank] = time.monotonic() + SHADOW_FOLLOW_S
        self._journal()

    async def _follow_shadow(self, rank: int, shadow: RankInfo):
        info = self.ranks[rank]
        source = (await self.node_request(info.node, {"op": "read_state", "rank": rank}))["source"]
        # The rank may have been lost meanwhile: then the recovery tells the shadow where to go.
        if self.shadows.get(rank) is shadow and self.ranks[rank] is info and info.status == "running" and \
                _post_step(source) is not None:
            self._send_plan(shadow, {"source": source, "ff_limit": max(0, _post_step(source) - 1)})
        self._shadow_next[rank] = time.monotonic() + SHADOW_FOLLOW_S

    async def _drop_shadow(self, rank: int):
        shadow = self.shadows.pop(rank, None)
        node = self.nodes.get(shadow.node) if shadow is not None and shadow.node is not None else None
        if node is not None and node.alive and node.conn is not None:
            with contextlib.suppress(core.Unrecoverable, asyncio.TimeoutError):
                await self.node_request(shadow.node, {"op": "kill", "rank": rank, "incarnation": shadow.incarnation})

    def _from_shadow(self, shadow: RankInfo, msg: dict):
        op = msg.get("op")
        if self.shadows.get(shadow.rank) is not shadow:
            return
        if op == "ff_progress":
            shadow.step = int(msg.get("step", shadow.step))
        elif op == "diverged":
            # Its control flow depends on values a fast-forward does not have: no shadow for
            # this rank (a recovery re-checks the same way and says so).
            print(f"lockstep: the shadow of rank {shadow.rank} diverged ({msg.get('message')}); it is dropped",
                  file=sys.stderr, flush=True)
            self._no_shadow.add(shadow.rank)
            asyncio.ensure_future(self._drop_shadow(shadow.rank))

    async def _adopt_shadow(self, rank: int, gen: int, source: dict) -> int | None:
        """The lost rank's shadow as its replacement: the step it had reached, or None (no
        shadow, or one that cannot take over: a plain spare is started instead)."""
        shadow = self.shadows.get(rank)
        if shadow is None:
            return None
        lost = self.ranks[rank]
        node = self.nodes.get(shadow.node)
        resume_at = _post_step(source)
        reply = {}
        if shadow.conn is not None and node is not None and node.alive and node.conn is not None and \
                shadow.node == lost.node and resume_at is not None and shadow.step <= resume_at:
            reply = await self.node_request(shadow.node, {"op": "adopt", "rank": rank, "incarnation": shadow.incarnation})
        if reply.get("op") != "adopted":
            await self._drop_shadow(rank)
            return None
        del self.shadows[rank]
        shadow.status = "recovering"
        shadow.events = {"expected_incarnation": shadow.incarnation, "plan": shadow.events.get("plan", {})}
        shadow.pid = reply.get("pid", shadow.pid)
        self.ranks[rank] = shadow
        self._update_plan(rank, {"generation": gen, "source": source, "resume_at": resume_at, "shadow": False})
        self._journal()
        return shadow.step

    # -- proactive migration ---------------------------------------------------------------

    async def migrate(self, rank: int) -> dict:
        if self._task is not None and not self._task.done():
            raise core.Unrecoverable(f"a {self._task_kind} is already under way")
        if rank not in self.ranks:
            raise core.Unrecoverable(f"rank {rank} is not in this job (world size {self.world_size})")
        info = self.ranks[rank]
        if info.status != "running":
            raise core.Unrecoverable(f"rank {rank} is {info.status}, not running")
        self._task_kind = "migration"
        self._task = asyncio.current_task()
        try:
            return await self._migrate(rank)
        finally:
            self._task_kind = None
            self._task = None

    async def _migrate(self, rank: int) -> dict:
        t0 = time.monotonic()
        old = self.ranks[rank]
        others = [r for r in self.ranks.values() if r.rank != rank and r.status == "running"]
        gen = self.generation + 1
        self._event("job.migration_started", {"rank": rank, "reason": "proactive", "from_node": old.node})
        old_addr, old_node, old_conn, old_incarnation = old.state_addr, old.node, old.conn, old.incarnation
        source = await self._read_source(rank)
        # The replacement fast-forwards behind the running rank, then the job holds at a
        # boundary close to where it caught up.
        replacement = RankInfo(rank)
        self.ranks[rank] = replacement
        replacement.status = "migrating"
        try:
            await self._start_replacement(rank, gen, source, resume_at=None,
                                          ff_limit=max(0, (_post_step(source) or 0) - 1))
            while True:
                await self.wait_until(lambda: "ff_progress" in replacement.events, "the replacement's fast-forward",
                                      timeout=RECOVERY_TIMEOUT_S)
                if old.status != "running":
                    raise core.Unrecoverable(f"rank {rank} is {old.status}: nothing left to migrate")
                behind = old.step - replacement.step
                if behind <= max(4, int(0.5 / max(old.step_time_s, 1e-3))):
                    break
                replacement.events.pop("ff_progress", None)
                source = await self.node_request(old_node, {"op": "read_state", "rank": rank})
                source = source["source"]
                self._update_plan(rank, {"source": source, "ff_limit": max(0, (_post_step(source) or 0) - 1)})
            live = [old, *others]
            step_time = max(r.step_time_s for r in live)
            boundary = core.hold_boundary([r.step for r in live], step_time)
            while True:
                for r in live:
                    r.holding_at = None
                    r.events.pop("hold_missed", None)
                    if r.conn:
                        r.conn.send({"op": "hold", "boundary": boundary})
                await self.wait_until(lambda b=boundary: all(r.holding_at == b or "hold_missed" in r.events for r in live),
                                      f"every rank to hold at step {boundary}")
                if not any("hold_missed" in r.events for r in live):
                    break
                for r in live:
                    if r.conn:
                        r.conn.send({"op": "release"})
                boundary = core.hold_boundary([r.step for r in live], step_time, lead_s=1.5)
            source = (await self.node_request(old_node, {"op": "read_state", "rank": rank}))["source"]
            for s in others:
                s.report = None
                s.conn.send({"op": "freeze", "generation": self.generation, "lost": [rank]})
            await self.wait_until(lambda: all(s.report is not None for s in others), "the survivors' reports")
            reports = [core.SurvivorReport(s.rank, int(s.report["step_no"]),
                                           {g: core.GroupProgress.from_report(p) for g, p in s.report["groups"].items()},
                                           s.state_addr or "", True) for s in others]
            plan = core.plan_recovery(gen, reports, {rank: boundary})
            for s in others:
                s.events.pop("rebuilt", None)
                s.conn.send(self._rebuild_order(gen, plan))
            self._update_plan(rank, {"source": source, "resume_at": boundary, "generation": gen,
                                     "live_after": plan.live_after, "donors": [old_addr] + plan.donors[rank],
                                     "rerun_from_seq": plan.rerun_from_seq})
            await self.wait_until(lambda: "resumed" in replacement.events and all("rebuilt" in s.events for s in others),
                                  "the group to re-form")
            paused = time.monotonic()
            await self.node_request(old_node, {"op": "expect_exit", "rank": rank, "incarnation": old_incarnation})
            if old_conn is not None:
                old_conn.send({"op": "hold", "boundary": boundary, "exit": True})
            for s in others:
                s.conn.send({"op": "release"})
            self.generation = gen
            await self.wait_until(lambda: "live" in replacement.events, "the replacement to go live")
        except BaseException:
            if self.ranks[rank] is replacement and replacement.conn is not None:
                replacement.conn.send({"op": "fail", "message": "migration abandoned"})
            self.ranks[rank] = old
            old.incarnation = old_incarnation
            for r in [old, *others]:
                if r.conn:
                    r.conn.send({"op": "release"})
            raise
        replacement.status = "running"
        took = time.monotonic() - t0
        result = {"rank": rank, "ok": True, "from_node": old_node, "to_node": replacement.node,
                  "boundary": boundary, "generation": gen, "duration_s": round(took, 3),
                  "paused_s": round(time.monotonic() - paused, 3)}
        self._event("job.migration_finished", dict(result, reason="proactive"))
        self._journal()
        return result

    def host_for_nodes(self) -> str:
        return getattr(self, "advertise", "127.0.0.1")

    # -- CLI -------------------------------------------------------------------------------

    def status(self) -> dict:
        return {
            "job": self.job, "generation": self.generation, "world_size": self.world_size,
            "nnodes": self.nnodes, "scheduler": self.scheduler_name,
            "spares": self.scheduler.spare_count() if self.scheduler else 0, "spares_used": self.spares_used,
            "problems": self.problems, "busy": self._task_kind,
            "ranks": [r.public() for r in self.ranks.values()],
            "shadows": [s.public() for s in self.shadows.values()],
            "nodes": [{"node": n.node, "host": n.host, "alive": n.alive, "spares": n.spares} for n in self.nodes.values()],
        }

    async def _handle_cli(self, reader, writer):
        conn = Conn(reader, writer)
        try:
            line = await reader.readline()
            msg = json.loads(line)
            handler = COMMANDS.get(msg.get("op"))
            if handler is None:
                reply = {"ok": False, "error": f"unknown op {msg.get('op')!r}"}
            else:
                try:
                    reply = await handler(self, msg)
                except core.Unrecoverable as exc:
                    reply = {"ok": False, "error": str(exc)}
                except asyncio.CancelledError:
                    reply = {"ok": False, "error": self.failure or "interrupted by a failure elsewhere in the job"}
                except Exception as exc:  # answer, never leave the CLI hanging on a closed socket
                    import traceback

                    traceback.print_exc()
                    reply = {"ok": False, "error": f"internal error: {exc!r}"}
            conn.send(reply)
            await writer.drain()
        except (ValueError, ConnectionError, OSError):
            pass
        finally:
            writer.close()


def _post_step(source: dict) -> int | None:
    post = source.get("post") if source else None
    return int(post[0]) if post else None


@command("status")
async def _status(orch: Orchestrator, msg: dict) -> dict:
    return {"ok": True, "status": orch.status()}


@command("migrate")
async def _migrate_cmd(orch: Orchestrator, msg: dict) -> dict:
    try:
        rank = int(msg["rank"])
    except (KeyError, TypeError, ValueError):
        return {"ok": False, "error": "migrate needs an integer 'rank'"}
    return {"ok": True, "result": await orch.migrate(rank)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m lockstep.orchestrator")
    ap.add_argument("--job", required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--nnodes", type=int, default=1)
    ap.add_argument("--scheduler", default="local")
    ap.add_argument("--host", default="0.0.0.0")  # noqa: S104 (the nodes' supervisors and ranks connect; hello needs the job token)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--advertise", default="127.0.0.1", help="the address other nodes reach this host at")
    ap.add_argument("--node", type=int, default=0, help="the node whose supervisor runs this process")
    ap.add_argument("--takeover-from", type=int, default=None,
                    help="resume from the journal a successor kept: this node's orchestrator was lost with it")
    ap.add_argument("--store", default=None, help="host:port of the store the ranks rebuild their groups in")
    args = ap.parse_args(argv)
    token = os.environ.get("LOCKSTEP_JOB_TOKEN", "")
    if not token:
        print("lockstep orchestrator: LOCKSTEP_JOB_TOKEN is not set", file=sys.stderr)
        return 2
    orch = Orchestrator(job=args.job, token=token, world_size=args.world_size, nnodes=args.nnodes,
                        scheduler_name=args.scheduler, host=args.host, port=args.port,
                        resume=args.resume or args.takeover_from is not None, node=args.node,
                        takeover_from=args.takeover_from, store=args.store)
    orch.advertise = args.advertise
    signal.signal(signal.SIGTERM, lambda *a: orch._done.set())
    return asyncio.run(orch.serve())


if __name__ == "__main__":
    sys.exit(main())
