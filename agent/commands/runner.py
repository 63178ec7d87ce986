"""Runs commands from the console: validate, execute with a timeout, record the outcome.

A fixed pool of executor threads takes commands from a queue. Each handler runs
in its own (daemon) thread that the executor waits on for at most the
command's timeout; a handler that is still running then is *abandoned*: the
command is reported ``failed`` with a sentence, its ``ctx.cancelled`` is set,
and the executor moves on. So a hung or crashing handler never wedges the
daemon. The effective timeout is the smaller of the command's ``timeout_s``
(from the console) and the command type's own.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent import __version__
from agent import log as agentlog
from agent.commands.registry import ArgError, CommandContext, Registry, validate_args
from agent.commands.store import CommandStore, valid_id

_STOP = object()


def _sentence(text: str) -> str:
    text = text.strip()
    if text and text[-1] not in ".!?":
        text += "."
    return text[:1].upper() + text[1:] if text else text


class CommandRunner:
    def __init__(
        self,
        registry: Registry,
        store: CommandStore,
        on_complete: Callable[[str, bool], None],
        emit: Callable[..., None] | None = None,
        services: Mapping[str, Any] | None = None,
        workers: int = 4,
    ):
        self.registry = registry
        self.store = store
        self.on_complete = on_complete  # (command id, force re-post)
        self.emit = emit
        self.services = dict(services or {})
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._in_flight: dict[str, dict] = {}  # id -> {"cmd":..., "started": bool, "ctx": ...}
        self._stopping = False
        self.abandoned = 0
        self.executed = 0
        self.duplicates = 0  # deliveries of a command already running or completed (not run again)
        self._threads = [
            threading.Thread(target=self._worker, name=f"cmd-exec-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    # -- intake -------------------------------------------------------------------------

    def submit(self, cmd: Any) -> str:
        """Take one command from a poll answer. Returns what happened (for logs and tests)."""
        if not isinstance(cmd, dict) or not valid_id(cmd.get("id")):
            agentlog.warning("command.bad_id", command=repr(cmd)[:200], msg="command without a usable id ignored")
            return "ignored"
        cid = cmd["id"]
        with self._lock:
            if self._stopping:
                return "stopping"
            if cid in self._in_flight:
                self.duplicates += 1
                agentlog.info("command.duplicate", id=cid, state="running", msg="already running; not run twice")
                return "duplicate_running"
            if self.store.completed(cid) is not None:
                self.duplicates += 1
                agentlog.info("command.duplicate", id=cid, state="completed", msg="stored result posted again")
                duplicate = True
            else:
                duplicate = False
                self._in_flight[cid] = {"cmd": cmd, "started": False, "ctx": None}
        if duplicate:
            self.on_complete(cid, True)
            return "duplicate_completed"
        self._queue.put(cmd)
        return "queued"

    def running_count(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # -- execution ----------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            cmd = self._queue.get()
            if cmd is _STOP:
                return
            cid = cmd["id"]
            with self._lock:
                entry = self._in_flight.get(cid)
                if self._stopping or entry is None:
                    self._in_flight.pop(cid, None)
                    continue
                entry["started"] = True
            try:
                self._execute(cmd, entry)
            except Exception as exc:  # never let a bug (or a full disk) kill an executor
                agentlog.error("command.internal_error", exc_info=True, id=cid, error=str(exc))
                try:
                    self._finish(cid, str(cmd.get("type", "")), "failed", None, f"Agent internal error: {exc}.")
                except Exception:
                    agentlog.error("command.unrecorded", exc_info=True, id=cid)
                    with self._lock:
                        self._in_flight.pop(cid, None)

    def _execute(self, cmd: dict, entry: dict) -> None:
        cid = cmd["id"]
        ctype_name = cmd.get("type")
        attempt = cmd.get("attempt") if isinstance(cmd.get("attempt"), int) else 1
        if not isinstance(ctype_name, str):
            self._finish(cid, "", "failed", None, "The command has no type.")
            return
        self.store.mark_running(cid, ctype_name, attempt)
        ctype = self.registry.get(ctype_name)
        if ctype is None:
            known = ", ".join(self.registry.names()) or "none"
            self._finish(
                cid,
                ctype_name,
                "failed",
                None,
                f"Unknown command type {ctype_name!r}: this agent (version {__version__}) knows {known}.",
            )
            return
        try:
            args = validate_args(ctype.args, cmd.get("args"))
        except ArgError as exc:
            self._finish(cid, ctype_name, "failed", None, _sentence(f"invalid arguments: {exc}"))
            return
        timeout = ctype.timeout_s
        requested = cmd.get("timeout_s")
        if isinstance(requested, (int, float)) and not isinstance(requested, bool) and requested > 0:
            timeout = min(timeout, float(requested))
        ctx = CommandContext(
            command_id=cid,
            type=ctype_name,
            attempt=attempt,
            deadline=time.monotonic() + timeout,
            emit=self.emit,
            services=self.services,
        )
        entry["ctx"] = ctx
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = ctype.handler(args, ctx)
            except BaseException as exc:  # noqa: BLE001 - report anything a handler raises
                box["exc"] = exc

        agentlog.info("command.start", id=cid, type=ctype_name, attempt=attempt, timeout_s=timeout)
        started = time.monotonic()
        handler_thread = threading.Thread(target=target, name=f"cmd-{ctype_name}-{cid[:8]}", daemon=True)
        handler_thread.start()
        handler_thread.join(timeout)
        self.executed += 1
        if handler_thread.is_alive():
            ctx.cancelled.set()
            with self._lock:
                self.abandoned += 1
            self._finish(
                cid,
                ctype_name,
                "failed",
                None,
                f"Timed out after {timeout:g} s; the handler was still running and was abandoned.",
            )
            return
        if "exc" in box:
            exc = box["exc"]
            if isinstance(exc, ArgError):  # the handler refused what it was asked: not a crash
                self._finish(cid, ctype_name, "failed", None, _sentence(f"invalid arguments: {exc}"))
                return
            self._finish(cid, ctype_name, "failed", None, _sentence(f"handler crashed: {type(exc).__name__}: {exc}"))
            return
        result = box.get("result")
        if result is None:
            result = {}
        if not isinstance(result, dict):
            self._finish(
                cid, ctype_name, "failed", None, f"The handler returned {type(result).__name__}, not a JSON object."
            )
            return
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            self._finish(cid, ctype_name, "failed", None, _sentence(f"the handler's result is not JSON: {exc}"))
            return
        agentlog.info("command.done", id=cid, type=ctype_name, seconds=round(time.monotonic() - started, 3))
        self._finish(cid, ctype_name, "succeeded", result, "")

    def _finish(self, cid: str, ctype: str, status: str, result: Any, error: str) -> None:
        record = self.store.complete(cid, ctype, status, result, error)
        with self._lock:
            self._in_flight.pop(cid, None)
        if record is None:
            return  # already finished (abandoned at shutdown, then completed late)
        if status == "failed":
            agentlog.warning("command.failed", id=cid, type=ctype, error=error)
        self.on_complete(cid, False)

    # -- shutdown -----------------------------------------------------------------------

    def shutdown(self, grace_s: float) -> list[str]:
        """Stop taking commands, wait up to ``grace_s`` for running ones, abandon the rest.

        Commands that were queued but never started are released: their ids are not
        stored, so the console offers them again when their lease ends. Returns the
        ids of commands abandoned while running.
        """
        with self._lock:
            self._stopping = True
            for cid in [c for c, e in self._in_flight.items() if not e["started"]]:
                self._in_flight.pop(cid)
                agentlog.info("command.released", id=cid, msg="not started before shutdown; the console will offer it again")
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._in_flight:
                    break
            time.sleep(0.02)
        abandoned = []
        with self._lock:
            remaining = list(self._in_flight.items())
        for cid, entry in remaining:
            ctx = entry.get("ctx")
            if ctx is not None:
                ctx.cancelled.set()
            cmd = entry["cmd"]
            self._finish(
                cid,
                str(cmd.get("type", "")),
                "failed",
                None,
                f"The agent shut down before this command finished (grace {grace_s:g} s); it was abandoned.",
            )
            abandoned.append(cid)
        for _ in self._threads:
            self._queue.put(_STOP)
        return abandoned
