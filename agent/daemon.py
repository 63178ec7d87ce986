"""The agent daemon: heartbeats, command long-poll, results, telemetry, inventory.

Each activity is its own thread with its own HTTP session, so none waits on
another and none waits on the console for long (every request has a timeout).
While the console is unreachable each loop retries with exponential backoff and
full jitter, capped by ``LOCKSTEP_BACKOFF_MAX_S``; commands keep their results on
disk and telemetry keeps accumulating in the bounded disk buffer.

``401 node_credential_invalid`` (or ``403 node_retired``) halts all traffic with
one clear log line; the daemon then waits, quietly, for the credential file to
change (``python -m agent enroll ...`` with a new token) and resumes.

SIGTERM/SIGINT: stop polling, let running commands finish for
``LOCKSTEP_SHUTDOWN_GRACE_S`` then abandon them (reported ``failed``), post
what results it can, keep the rest on disk, exit 0.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from agent import __version__, telemetry
from agent import log as agentlog
from agent.backoff import Backoff
from agent.client import Client, ConsoleError
from agent.commands import default_registry, load_modules
from agent.commands.registry import Registry
from agent.commands.runner import CommandRunner
from agent.commands.store import CommandStore
from agent.config import Config
from agent.enroll import EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, EnrollError, enroll, success_line
from agent.health import node_health
from agent.inventory import HostPaths, collect, fingerprint
from agent.inventory.gpus import load_nvml
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
    ):
        self.config = config
        if registry is None:
            load_modules(config.command_modules)
            registry = default_registry
        self.registry = registry
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
        self._threads: list[threading.Thread] = []
        self.runner: CommandRunner | None = None
        self.store: CommandStore | None = None
        self.buffer: telemetry.TelemetryBuffer | None = None
        self.poster: ResultPoster | None = None
        self.ready = threading.Event()  # set once the loops run (tests wait on it)

    # -- lifecycle ------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
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
                msg="no node credential stored: run `python -m agent enroll --console URL --token lse_...` "
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
        # "host_paths" and "nvml": where command handlers (the audit checks) read the host from
        services = {"inventory": self.collect_inventory, "health": self.health, "host_paths": self.paths,
                    "nvml": self.nvml}
        self.runner = CommandRunner(
            self.registry, self.store, self.poster.notify, emit=self.buffer.emit, services=services,
            workers=self.workers,
        )
        for record in self.store.unposted():
            self.poster.notify(record["id"], False)
        for name, target in (
            ("heartbeat", self._heartbeat_loop),
            ("poll", self._poll_loop),
            ("results", self.poster.loop),
            ("telemetry", self._telemetry_loop),
            ("inventory", self._inventory_loop),
            ("health", self._health_loop),
        ):
            thread = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _shutdown(self) -> None:
        agentlog.info("agent.stopping", grace_s=self.config.shutdown_grace_s)
        assert self.runner is not None and self.poster is not None and self.buffer is not None
        abandoned = self.runner.shutdown(self.config.shutdown_grace_s)
        for cid in abandoned:
            agentlog.warning("command.abandoned", id=cid, msg="still running at shutdown; reported failed")
        for thread in self._threads:
            thread.join(timeout=0.2)
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
                "stopped. Re-enroll the node: python -m agent enroll --console URL --token lse_..."
            )
        agentlog.error("agent.halted", reason=exc.code, detail=exc.detail, msg=msg)

    def wait_ready(self) -> bool:
        """Block while halted; False once stopping."""
        while self._halted and not self._stop.is_set():
            self._stop.wait(0.5)
        return not self._stop.is_set()

    def handle_error(self, where: str, exc: ConsoleError, backoff: Backoff, failures: list[int]) -> None:
        """Log a failed request (not every one), halt on credential errors, sleep the backoff."""
        if self._stop.is_set():
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
        self._stop.wait(delay)

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

    # -- loops ----------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        client = self.client()
        backoff, failures = self.new_backoff(), [0]
        while self.wait_ready():
            assert self.cred is not None and self.buffer is not None and self.runner is not None
            stats = self.buffer.stats()
            body = {
                "agent_version": __version__,
                "uptime_s": round(time.monotonic() - self.started, 1),
                "telemetry_buffered": stats["buffered"],
                "telemetry_dropped": stats["dropped_total"],
                "commands_running": self.runner.running_count(),
            }
            try:
                self.sync_client(client).heartbeat(body)
            except ConsoleError as exc:
                self.handle_error("heartbeat", exc, backoff, failures)
                continue
            self.recovered("heartbeat", backoff, failures)
            self._stop.wait(float(self.cred.heartbeat_interval_s))
        client.close()

    def _poll_loop(self) -> None:
        client = self.client()
        backoff, failures = self.new_backoff(), [0]
        while self.wait_ready():
            assert self.cred is not None and self.runner is not None
            wait = max(0.0, min(30.0, float(self.cred.poll_wait_s)))
            try:
                commands = self.sync_client(client).poll(wait=wait, max_commands=10)
            except ConsoleError as exc:
                self.handle_error("poll", exc, backoff, failures)
                continue
            self.recovered("poll", backoff, failures)
            if self._stop.is_set():
                break  # claimed but not started: the console offers them again when the lease ends
            for cmd in commands:
                self.runner.submit(cmd)
        client.close()

    def _telemetry_loop(self) -> None:
        client = self.client()
        backoff, failures = self.new_backoff(), [0]
        buf = self.buffer
        assert buf is not None
        while self.wait_ready():
            batch = buf.next_batch()
            if batch is None:
                buf.wait(min(1.0, buf.linger_s))
                continue
            data = buf.encode(batch)
            assert self.cred is not None
            if len(data) > int(self.cred.telemetry_max_batch_bytes):
                if not buf.split_head():
                    buf.discard_head("record larger than the console's batch bound")
                continue
            try:
                status, answer = self.sync_client(client).post_telemetry(data)
            except ConsoleError as exc:
                if exc.status == 413:
                    if not buf.split_head():
                        buf.discard_head("the console refused a single record as too large")
                    continue
                if exc.status == 400:
                    buf.discard_head(f"refused as malformed: {exc.detail}", _bad_record_index(exc.body))
                    continue
                self.handle_error("telemetry", exc, backoff, failures)
                continue
            self.recovered("telemetry", backoff, failures)
            duplicate = isinstance(answer, dict) and answer.get("duplicate")
            agentlog.debug(
                "telemetry.sent", seq=batch["seq"], records=len(batch["records"]), dropped=batch["dropped"],
                duplicate=bool(duplicate),
            )
            buf.ack(batch["seq"])
        client.close()

    def _inventory_loop(self) -> None:
        client = self.client(timeout=30.0)
        backoff, failures = self.new_backoff(), [0]
        sent: str | None = None
        next_check = 0.0
        while self.wait_ready():
            if time.monotonic() < next_check:
                self._stop.wait(min(1.0, next_check - time.monotonic()))
                continue
            try:
                document = self.collect_inventory()
            except Exception as exc:  # inventory must never kill the loop
                agentlog.error("inventory.failed", exc_info=True, error=str(exc))
                next_check = time.monotonic() + self.config.inventory_interval_s
                continue
            digest = fingerprint(document)
            if digest == sent:
                next_check = time.monotonic() + self.config.inventory_interval_s
                continue
            try:
                answer = self.sync_client(client).put_inventory(document)
            except ConsoleError as exc:
                if exc.status in (400, 413):
                    agentlog.error("inventory.refused", status=exc.status, error=exc.code, detail=exc.detail)
                    next_check = time.monotonic() + self.config.inventory_interval_s
                    continue
                self.handle_error("inventory", exc, backoff, failures)
                continue
            self.recovered("inventory", backoff, failures)
            sent = digest
            agentlog.info("inventory.sent", gpus=len(document["gpus"]), nics=len(document["nics"]), answer=answer)
            next_check = time.monotonic() + self.config.inventory_interval_s
        client.close()

    def _health_loop(self) -> None:
        while not self._stop.wait(self.config.health_interval_s):
            try:
                summary = self.health()
                assert self.buffer is not None
                self.buffer.emit("node.health", summary)
            except Exception as exc:
                agentlog.error("health.failed", exc_info=True, error=str(exc))

    # -- services for commands ------------------------------------------------------------

    def collect_inventory(self) -> dict:
        return collect(self.paths, nvml=self.nvml, hostname=self.config.hostname, machine_id=self.config.machine_id)

    def health(self) -> dict:
        return node_health(self.paths, self.nvml, self.state_dir)


def _bad_record_index(body: Any) -> int | None:
    import re

    fields = body.get("fields") if isinstance(body, dict) else None
    if isinstance(fields, dict):
        for key in fields:
            match = re.match(r"^records\[(\d+)\]", str(key))
            if match:
                return int(match.group(1))
    return None


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

    def loop(self) -> None:
        daemon = self.daemon
        client = daemon.client()
        backoff, failures = daemon.new_backoff(), [0]
        while daemon.wait_ready():
            item = self._next(0.5)
            if item is None:
                continue
            exc = self.post_one(client, item)
            if exc is None:
                daemon.recovered("result", backoff, failures)
                continue
            self._requeue(item)
            if exc.status == 413:
                continue
            daemon.handle_error("result", exc, backoff, failures)
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
