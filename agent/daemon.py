"""The agent daemon: credentials, the command runner, the telemetry buffer, and the supervisor
that runs every loop.

The loops — heartbeats, the command long-poll, result posting, the telemetry sender, inventory,
health, the local socket and its event forwarder — are activities (``agent/activities/``) under
one :class:`~agent.activities.Supervisor`: each in its own thread with its own HTTP session,
restarted with backoff when it crashes, its health in every heartbeat. Features add theirs
the same way, and the console starts, stops and re-plans them with ``activity.set``.

``401 node_credential_invalid`` (or ``403 node_retired``) halts all traffic with one clear log
line; the daemon then waits, quietly, for the credential file to change (``python -m agent
enroll ...`` with a new token) and resumes.

SIGTERM/SIGINT: stop the loops, let running commands finish for ``LOCKSTEP_SHUTDOWN_GRACE_S``
then abandon them (reported ``failed``), post what results it can, keep the rest on disk,
exit 0.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from agent import __version__, telemetry
from agent import log as agentlog
from agent.activities import ActivityRegistry, DesiredState, Supervisor, default_activities
from agent.backoff import Backoff
from agent.client import Client, ConsoleError
from agent.clusterclock import ClusterClock
from agent.commands import default_registry, load_modules
from agent.commands.registry import Registry
from agent.commands.runner import CommandRunner
from agent.commands.store import CommandStore
from agent.config import Config
from agent.enroll import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, EnrollError, enroll, success_line
from agent.health import node_health
from agent.inventory import HostPaths, collect
from agent.inventory.gpus import load_nvml
from agent.localsock.server import EventQueue
from agent.state import Credential, StateError, credential_path, ensure_private_dir, load_credential

_DEFAULT = object()
HALTING_ERRORS = {"node_credential_invalid", "node_retired"}


class Daemon:
    def __init__(
        self,
        config: Config,
        registry: Registry | None = None,
        nvml: Any = _DEFAULT,
        paths: HostPaths | None = None,
        workers: int = 4,
        activities: ActivityRegistry | None = None,
    ):
        self.config = config
        if registry is None or activities is None:
            load_modules(config.command_modules)
        self.registry = registry if registry is not None else default_registry
        self.activities = activities if activities is not None else default_activities
        self.paths = paths or HostPaths.from_sysfs_root(config.sysfs_root)
        if nvml is _DEFAULT:
            nvml, _ = load_nvml()
        self.nvml = nvml
        self.workers = workers
        self.state_dir = Path(config.state_dir)
        self.cred: Credential | None = None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._halt_lock = threading.Lock()
        self._halted: str | None = None
        self._cred_stamp: tuple | None = None
        self.runner: CommandRunner | None = None
        self.store: CommandStore | None = None
        self.buffer: telemetry.TelemetryBuffer | None = None
        self.poster: ResultPoster | None = None
        self.supervisor: Supervisor | None = None
        self.cluster_clock = ClusterClock()  # clock sync plugs its estimator in here
        self.events = EventQueue()  # local socket -> agent.events -> telemetry
        self.ready = threading.Event()  # set once the loops run (tests wait on it)

    def clock_reading(self) -> dict | None:
        """Cluster time for command handlers (the audit's load start and clock check): the clock-sync
        provider's answer, or None while no clock sync runs on this node."""
        if self.cluster_clock.provider is None:
            return None
        return self.cluster_clock.now().answer()

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin the shutdown (safe in a signal handler); :meth:`run` finishes it."""
        self._stop.set()
        if self.supervisor is not None:
            self.supervisor.request_stop()
        if self.buffer is not None:
            self.buffer.notify()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        for key in self.config.unknown_keys:
            agentlog.warning("config.unknown_key", key=key, msg="unknown LOCKSTEP_ key ignored")
        try:
            ensure_private_dir(self.state_dir)
            code = self._ensure_credential()
        except StateError as exc:
            agentlog.error("agent.state_error", msg=str(exc))
            return EXIT_USAGE
        if code is not None:
            return code
        assert self.cred is not None
        self._start()
        agentlog.info(
            "agent.started",
            version=__version__,
            node=self.cred.node_id,
            node_name=self.cred.node_name,
            console=self.console_url,
            commands=",".join(self.registry.names()),
            activities=",".join(self.activities.names()),
        )
        self.ready.set()
        next_prune = time.monotonic() + 3600
        while not self._stop.wait(1.0):
            self._watch_credential()
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + 3600
                try:
                    self.store.prune()
                except OSError as exc:
                    agentlog.warning("commands.prune_failed", error=str(exc))
        self._shutdown()
        return EXIT_OK

    @property
    def console_url(self) -> str:
        return self.config.console_url or (self.cred.console_url if self.cred else "")

    def _ensure_credential(self) -> int | None:
        try:
            self.cred = load_credential(self.state_dir)
        except StateError as exc:
            agentlog.error("credential.unreadable", msg=str(exc))
            self.cred = None
            if not self.config.enroll_token:
                return EXIT_USAGE
        if self.cred is not None:
            self._cred_stamp = self._stamp()
            return None
        if not self.config.enroll_token:
            agentlog.error(
                "agent.not_enrolled",
                state_dir=str(self.state_dir),
                msg="no node credential stored: run `python -m agent enroll --console URL --token-file FILE` "
                "or set LOCKSTEP_ENROLL_TOKEN",
            )
            return EXIT_USAGE
        if not self.config.console_url:
            agentlog.error("agent.no_console_url", msg="LOCKSTEP_ENROLL_TOKEN is set but LOCKSTEP_CONSOLE_URL is not")
            return EXIT_USAGE
        backoff = Backoff(base=1.0, cap=self.config.backoff_max_s)
        while not self._stop.is_set():
            try:
                self.cred, path = enroll(
                    self.config.console_url,
                    self.config.enroll_token,
                    self.state_dir,
                    cluster_id=self.config.cluster_id,
                    hostname=self.config.hostname,
                    machine_id=self.config.machine_id,
                    paths=self.paths,
                )
            except EnrollError as exc:
                if exc.exit_code != EXIT_UNREACHABLE:
                    agentlog.error("enroll.refused", exit_code=exc.exit_code, msg=exc.message)
                    return exc.exit_code
                delay = backoff.next_delay()
                agentlog.warning("enroll.retry", retry_in_s=round(delay, 2), msg=exc.message)
                self._stop.wait(delay)
                continue
            agentlog.info("enroll.ok", node=self.cred.node_id, msg=success_line(self.cred, path))
            self._cred_stamp = self._stamp()
            return None
        return EXIT_OK

    def _start(self) -> None:
        assert self.cred is not None
        self.store = CommandStore(self.state_dir / "commands")
        recovered = self.store.recover()
        for cid in recovered:
            agentlog.warning("command.interrupted", id=cid, msg="was running when the agent stopped; reported failed")
        self.store.prune()
        self.buffer = telemetry.TelemetryBuffer(
            self.state_dir / "telemetry",
            self.config.telemetry_buffer_bytes,
            batch_max_bytes=int(self.cred.telemetry_max_batch_bytes),
            batch_max_records=int(self.cred.telemetry_max_records),
        )
        telemetry.set_sink(self.buffer)
        self.poster = ResultPoster(self)
        self.supervisor = Supervisor(
            self.activities,
            services={"daemon": self, "cluster_clock": self.cluster_clock, "config": self.config},
            desired=DesiredState.in_state_dir(self.state_dir),
            emit=self.buffer.emit,
            backoff_base_s=min(1.0, self.config.backoff_max_s),
            backoff_max_s=self.config.backoff_max_s,
        )
        # "host_paths" and "nvml": where command handlers (the audit checks) read the host from
        services = {"inventory": self.collect_inventory, "health": self.health, "activities": self.supervisor,
                    "host_paths": self.paths, "nvml": self.nvml, "clock": self.clock_reading}
        self.runner = CommandRunner(
            self.registry, self.store, self.poster.notify, emit=self.buffer.emit, services=services,
            workers=self.workers,
        )
        for record in self.store.unposted():
            self.poster.notify(record["id"], False)
        self.supervisor.start()

    def _shutdown(self) -> None:
        agentlog.info("agent.stopping", grace_s=self.config.shutdown_grace_s)
        assert self.runner is not None and self.poster is not None and self.buffer is not None
        assert self.supervisor is not None
        self.supervisor.stop_all()  # no new polls, no new rounds; loops return as they notice
        abandoned = self.runner.shutdown(self.config.shutdown_grace_s)
        for cid in abandoned:
            agentlog.warning("command.abandoned", id=cid, msg="still running at shutdown; reported failed")
        self.supervisor.join(0.5)
        self.poster.drain(deadline=time.monotonic() + min(3.0, max(0.5, self.config.shutdown_grace_s)))
        telemetry.set_sink(None)
        self.buffer.close()
        stats = self.buffer.stats()
        agentlog.info(
            "agent.stopped",
            telemetry_buffered=stats["buffered"],
            results_unposted=len(self.store.unposted()) if self.store else 0,
        )

    # -- console access -------------------------------------------------------------------

    def client(self, timeout: float = 15.0) -> Client:
        assert self.cred is not None
        return Client(self.console_url, self.cred.credential, timeout=timeout)

    def sync_client(self, client: Client) -> Client:
        """Keep a loop's client on the current credential and URL (they change on re-enrollment)."""
        assert self.cred is not None
        client.credential = self.cred.credential
        client.base_url = self.console_url.rstrip("/")
        return client

    def halted(self) -> str | None:
        return self._halted

    def halt(self, exc: ConsoleError) -> None:
        with self._halt_lock:
            if self._halted:
                return
            self._halted = exc.code
        if exc.code == "node_retired":
            msg = "the console says this node is retired; all requests stopped. Re-enroll it to use it again."
        else:
            msg = (
                "the console does not accept this node's credential (revoked or unknown); all requests "
                "stopped. Re-enroll the node: python -m agent enroll --console URL --token-file FILE"
            )
        agentlog.error("agent.halted", reason=exc.code, detail=exc.detail, msg=msg)

    def wait_ready(self, ctx) -> bool:
        """Block while halted; False once the loop of ``ctx`` must stop."""
        while self._halted and ctx.running():
            ctx.stop_event.wait(0.5)
        return ctx.running()

    def handle_error(self, where: str, exc: ConsoleError, backoff: Backoff, failures: list[int], ctx) -> None:
        """Log a failed request (not every one), halt on credential errors, sleep the backoff."""
        if not ctx.running():
            return  # a request cut by our own shutdown is not worth a log line
        if exc.code in HALTING_ERRORS:
            self.halt(exc)
            return
        failures[0] += 1
        delay = backoff.after(exc.retry_after_s)
        if failures[0] == 1 or failures[0] % 20 == 0:
            level = agentlog.warning if exc.transient else agentlog.error
            level(
                "console.error",
                where=where,
                status=exc.status if exc.status is not None else "-",
                error=exc.code,
                detail=exc.detail[:300],
                failures=failures[0],
                retry_in_s=round(delay, 2),
            )
        ctx.stop_event.wait(delay)

    def recovered(self, where: str, backoff: Backoff, failures: list[int]) -> None:
        if failures[0]:
            agentlog.info("console.reachable", where=where, after_failures=failures[0])
        failures[0] = 0
        backoff.reset()

    def new_backoff(self) -> Backoff:
        return Backoff(base=min(0.5, self.config.backoff_max_s), cap=self.config.backoff_max_s)

    def _stamp(self) -> tuple | None:
        try:
            st = os.stat(credential_path(self.state_dir))
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _watch_credential(self) -> None:
        stamp = self._stamp()
        if stamp == self._cred_stamp:
            return
        self._cred_stamp = stamp
        try:
            cred = load_credential(self.state_dir)
        except StateError as exc:
            agentlog.error("credential.unreadable", msg=str(exc))
            return
        if cred is None:
            agentlog.error("credential.removed", msg="the credential file was removed; requests paused")
            with self._halt_lock:
                self._halted = "credential_removed"
            return
        changed = self.cred is None or cred.credential != self.cred.credential
        self.cred = cred
        if changed:
            with self._halt_lock:
                was = self._halted
                self._halted = None
            agentlog.info("credential.reloaded", node=cred.node_id, resumed=bool(was))

    def heartbeat_body(self) -> dict:
        assert self.buffer is not None and self.runner is not None and self.supervisor is not None
        stats = self.buffer.stats()
        return {
            "agent_version": __version__,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "telemetry_buffered": stats["buffered"],
            "telemetry_dropped": stats["dropped_total"],
            "commands_running": self.runner.running_count(),
            "activities": bounded_health(self.supervisor.health()),
        }

    # -- services for commands ------------------------------------------------------------

    def collect_inventory(self) -> dict:
        return collect(self.paths, nvml=self.nvml, hostname=self.config.hostname, machine_id=self.config.machine_id)

    def health(self) -> dict:
        return node_health(self.paths, self.nvml, self.state_dir)


HEALTH_MAX_BYTES = 32 * 1024  # of the heartbeat's 64 KiB bound


def bounded_health(entries: list[dict]) -> list[dict]:
    """The activity health for a heartbeat, within HEALTH_MAX_BYTES: without the activities' own
    status first, then without the last entries (essential ones come first)."""
    def size(items: list[dict]) -> int:
        return len(json.dumps(items, separators=(",", ":"), default=str))

    if size(entries) <= HEALTH_MAX_BYTES:
        return entries
    entries = [{k: v for k, v in e.items() if k != "status"} for e in entries]
    while entries and size(entries) > HEALTH_MAX_BYTES:
        entries.pop()
    return entries


class ResultPoster:
    """Posts command results, in completion order, until the console has each one."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self._queue: collections.deque[tuple[str, bool]] = collections.deque()
        self._cond = threading.Condition()

    def notify(self, command_id: str, force: bool) -> None:
        with self._cond:
            if (command_id, force) not in self._queue:
                self._queue.append((command_id, force))
            self._cond.notify_all()

    def _next(self, timeout: float) -> tuple[str, bool] | None:
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout)
            return self._queue.popleft() if self._queue else None

    def _requeue(self, item: tuple[str, bool]) -> None:
        with self._cond:
            self._queue.appendleft(item)

    def post_one(self, client: Client, item: tuple[str, bool]) -> ConsoleError | None:
        """Post one result; None when done with it, the error when it must be retried."""
        store = self.daemon.store
        assert store is not None
        cid, force = item
        record = store.completed(cid)
        if record is None or (record.get("posted") and not force):
            return None
        try:
            answer = self.daemon.sync_client(client).post_result(
                cid, record["status"], record.get("result"), record.get("error") or ""
            )
        except ConsoleError as exc:
            if exc.status == 404:
                agentlog.warning("result.unknown_command", id=cid, msg="the console does not know this command")
                store.mark_posted(cid)
                return None
            if exc.status == 413:
                store.replace_outcome(
                    cid, "failed", None,
                    "The result was larger than the console accepts; it was not kept. Narrow the command's scope.",
                )
                return exc
            if exc.status is not None and 400 <= exc.status < 500 and exc.code not in HALTING_ERRORS \
                    and exc.status != 429:
                agentlog.error("result.refused", id=cid, status=exc.status, error=exc.code, detail=exc.detail)
                store.mark_posted(cid)
                return None
            return exc
        store.mark_posted(cid)
        agentlog.info("result.posted", id=cid, status=record["status"], accepted=answer.get("accepted"))
        return None

    def loop(self, ctx) -> None:
        """The ``agent.results`` activity."""
        daemon = self.daemon
        client = daemon.client()
        backoff, failures = daemon.new_backoff(), [0]
        posted = 0
        try:
            while daemon.wait_ready(ctx):
                item = self._next(0.5)
                if item is None:
                    continue
                exc = self.post_one(client, item)
                if exc is None:
                    daemon.recovered("result", backoff, failures)
                    posted += 1
                    ctx.progress(posted=posted)
                    continue
                self._requeue(item)
                if exc.status == 413:
                    continue
                daemon.handle_error("result", exc, backoff, failures, ctx)
        finally:
            client.close()

    def drain(self, deadline: float) -> None:
        """At shutdown: post what can be posted before ``deadline``; the rest stays on disk."""
        if self.daemon.halted():
            return
        client = self.daemon.client(timeout=max(0.5, deadline - time.monotonic()))
        try:
            while time.monotonic() < deadline:
                item = self._next(0)
                if item is None:
                    return
                exc = self.post_one(client, item)
                if exc is not None and exc.status != 413:
                    return
        finally:
            client.close()
