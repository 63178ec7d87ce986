"""The one skeleton that runs every activity: start, stop, re-plan, restart with backoff, health.

Each running activity has one thread; its loop runs in it, and after a crash the same thread
waits out the backoff and runs the loop again, so an activity never runs twice at once (a
start that arrives while the loop is still stopping takes effect when it has returned).

Crash: the loop raised, or returned while it should run. The restart comes after an
exponential backoff with equal jitter (base ``backoff_base_s``, doubling, capped at
``backoff_max_s``); a run that made progress (``ctx.progress``) or lasted ``stable_s`` resets
it. A new plan or a start request during the backoff restarts it at once; a stop ends it.

Health (:meth:`Supervisor.health`, sent in every heartbeat): per activity ``state``
(``starting``, ``running``, ``stalled``, ``backoff``, ``stopping``, ``stopped``,
``unavailable``),
``desired``, ``restarts``, ``last_error`` and ``last_error_at``, ``started_at``,
``last_progress_at`` (Unix seconds), ``retry_in_s`` while in backoff, the plan's
``revision`` and the loop's own small ``status`` (what it passed to ``ctx.progress``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent import __version__
from agent import log as agentlog
from agent.activities.desired import DesiredState
from agent.activities.registry import ActivityError, ActivityRegistry, ActivityType
from agent.backoff import Backoff
from agent.commands.registry import ArgError

STATUS_MAX_BYTES = 1024
ERROR_MAX_CHARS = 300


class ActivityContext:
    """What a loop gets: its plan, its stop signal, progress and telemetry."""

    def __init__(self, name: str, plan: dict, services: Mapping[str, Any], emit: Callable[..., None],
                 on_progress: Callable[[dict], None]):
        self.name = name
        self.services = services
        self._emit = emit
        self._on_progress = on_progress
        self._cond = threading.Condition()
        self._plan = plan
        self._stop = threading.Event()
        self._wake_sleep = False
        self._changed = False

    @property
    def plan(self) -> dict:
        """The current validated arguments (a new dict after each re-plan; do not modify it)."""
        with self._cond:
            return self._plan

    @property
    def stop_event(self) -> threading.Event:
        """Set when the loop must return: for waits on something else (``event.wait(timeout)``)."""
        return self._stop

    def running(self) -> bool:
        """False once the activity is asked to stop (a command, or the agent shutting down)."""
        return not self._stop.is_set()

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; wakes early on a re-plan. False when the loop must stop."""
        deadline = time.monotonic() + max(0.0, seconds)
        with self._cond:
            while not self._stop.is_set() and not self._wake_sleep:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._wake_sleep = False
            return not self._stop.is_set()

    def plan_changed(self) -> bool:
        """True once after each re-plan (for loops that rebuild state from the plan)."""
        with self._cond:
            changed, self._changed = self._changed, False
            return changed

    def progress(self, **status: Any) -> None:
        """Record that the loop did useful work; ``status`` (small, JSON) is merged into its health."""
        self._on_progress(status)

    def emit(self, kind: str, data: dict, ts: float | str | None = None) -> None:
        """A telemetry record (see :mod:`agent.telemetry`); raises ValueError naming what is wrong."""
        self._emit(kind, data, ts)

    # -- supervisor side ----------------------------------------------------------------

    def _replan(self, plan: dict) -> None:
        with self._cond:
            self._plan = plan
            self._changed = True
            self._wake_sleep = True
            self._cond.notify_all()

    def _request_stop(self) -> None:
        with self._cond:
            self._stop.set()
            self._cond.notify_all()


class _Slot:
    """One activity type's supervision: desired state, its thread, its health. Guarded by the
    supervisor's lock."""

    def __init__(self, sup: Supervisor, atype: ActivityType, state: str, plan: dict, revision: int | None):
        self.sup = sup
        self.type = atype
        self.desired = state
        self.plan = plan
        self.revision = revision
        self.thread: threading.Thread | None = None
        self.ctx: ActivityContext | None = None
        self.wake = threading.Event()
        self.backoff = Backoff(base=sup.backoff_base_s, cap=sup.backoff_max_s, jitter="equal")
        self.state = "stopped"
        self.restarts = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.started_at: float | None = None
        self.started_mono = 0.0
        self.last_progress_at: float | None = None
        self.last_progress_mono: float | None = None
        self.progressed = False
        self.status: dict = {}
        self.retry_at: float | None = None

    # -- control (lock held) ------------------------------------------------------------

    def apply(self, state: str, plan: dict) -> None:
        self.desired = state
        replanned = plan != self.plan
        self.plan = plan
        ctx = self.ctx
        if state == "running":
            if ctx is not None and ctx.running():
                if replanned:
                    ctx._replan(plan)
                    agentlog.info("activity.replanned", activity=self.type.name, revision=self.revision)
                return
            self.wake.set()  # in backoff, or still stopping: the thread looks again
            self.ensure_thread()
        else:
            if ctx is not None:
                ctx._request_stop()
            self.wake.set()

    def ensure_thread(self) -> None:
        if self.thread is None and self.desired == "running" and not self.sup._stopping:
            self.state = "starting"
            self.thread = threading.Thread(target=self._main, name=f"activity-{self.type.name}", daemon=True)
            self.sup._threads.append(self.thread)
            self.thread.start()

    def record_progress(self, status: dict) -> None:
        with self.sup._lock:
            self.last_progress_at = time.time()
            self.last_progress_mono = time.monotonic()
            self.progressed = True
            if status:
                self.status.update(status)

    # -- the thread ---------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._supervise()
        except BaseException as exc:  # a bug here must still leave the slot restartable
            agentlog.error("activity.supervisor_failed", exc_info=True, activity=self.type.name, error=repr(exc))
            with self.sup._lock:
                self.ctx = None
                self.state = "stopped"
                self.last_error = f"supervisor: {type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS]
                self.last_error_at = time.time()
                if self.thread is threading.current_thread():
                    self.thread = None

    def _supervise(self) -> None:
        sup = self.sup
        name = self.type.name
        while True:
            with sup._lock:
                if self.desired != "running" or sup._stopping:
                    self.state = "stopped"
                    self.retry_at = None
                    self.thread = None
                    return
                ctx = ActivityContext(name, self.plan, sup.services, sup.emit, self.record_progress)
                self.ctx = ctx
                self.state = "running"
                self.retry_at = None
                self.started_at = time.time()
                self.started_mono = time.monotonic()
                self.progressed = False
                self.wake.clear()
            agentlog.debug("activity.started", activity=name, revision=self.revision)
            error = None
            try:
                self.type.run(ctx)
                if ctx.running():
                    error = "the loop returned while it should keep running"
            except Exception as exc:  # a crash of one loop never takes the agent down
                error = f"{type(exc).__name__}: {exc}"
                if ctx.running():  # the traceback once per streak of crashes, not at every restart
                    agentlog.error("activity.crashed", exc_info=self.backoff.failures == 0, activity=name,
                                   error=error[:ERROR_MAX_CHARS])
            with sup._lock:
                self.ctx = None
                if error is not None:
                    self.last_error = error[:ERROR_MAX_CHARS]
                    self.last_error_at = time.time()
                if not ctx.running() or sup._stopping:  # asked to stop: no restart, whatever the loop did
                    self.state = "stopped"
                    agentlog.debug("activity.stopped", activity=name)
                    continue
                if self.progressed or time.monotonic() - self.started_mono >= sup.stable_s:
                    self.backoff.reset()
                delay = self.backoff.next_delay()
                self.restarts += 1
                self.state = "backoff"
                self.retry_at = time.monotonic() + delay
                restarts = self.restarts
            agentlog.warning("activity.restart_scheduled", activity=name, restarts=restarts,
                             retry_in_s=round(delay, 3), error=error[:ERROR_MAX_CHARS])
            self.wake.wait(delay)

    # -- health (lock held) -------------------------------------------------------------

    def health(self, now_mono: float) -> dict:
        state = self.state
        ctx = self.ctx
        if ctx is not None and not ctx.running():
            state = "stopping"
        elif state == "running" and self.type.stall_after_s is not None:
            last = self.last_progress_mono if self.progressed else self.started_mono
            if now_mono - last > self.type.stall_after_s:
                state = "stalled"
        entry: dict[str, Any] = {
            "name": self.type.name,
            "state": state,
            "desired": self.desired,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "last_error_at": _rounded(self.last_error_at),
            "started_at": _rounded(self.started_at),
            "last_progress_at": _rounded(self.last_progress_at),
        }
        if self.type.essential:
            entry["essential"] = True
        if self.revision is not None:
            entry["revision"] = self.revision
        if state == "backoff" and self.retry_at is not None:
            entry["retry_in_s"] = round(max(0.0, self.retry_at - now_mono), 3)
        if self.status:
            entry["status"] = _bounded(self.status)
        return entry


def _rounded(ts: float | None) -> float | None:
    return round(ts, 3) if ts is not None else None


def _bounded(status: dict) -> dict:
    try:
        size = len(json.dumps(status, separators=(",", ":"), default=str))
    except (TypeError, ValueError):
        return {"unreadable": True}
    if size > STATUS_MAX_BYTES:
        return {"truncated": True, "bytes": size}
    return json.loads(json.dumps(status, default=str))


class Supervisor:
    """Runs the activities of a registry; the daemon owns one."""

    def __init__(
        self,
        registry: ActivityRegistry,
        services: Mapping[str, Any] | None = None,
        desired: DesiredState | None = None,
        emit: Callable[..., None] | None = None,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 60.0,
        stable_s: float = 60.0,
    ):
        self.registry = registry
        self.services = services if services is not None else {}
        self.desired = desired or DesiredState(None)
        if emit is None:
            from agent import telemetry

            emit = telemetry.emit
        self.emit = emit
        self.backoff_base_s = min(backoff_base_s, backoff_max_s)
        self.backoff_max_s = backoff_max_s
        self.stable_s = stable_s
        self._lock = threading.RLock()
        self._stopping = False
        self._started = False
        self._threads: list[threading.Thread] = []
        self._slots: dict[str, _Slot] = {}
        for name in registry.names():
            atype = registry.get(name)
            assert atype is not None
            state, plan, revision = self._initial(atype)
            self._slots[name] = _Slot(self, atype, state, plan, revision)

    def _initial(self, atype: ActivityType) -> tuple[str, dict, int | None]:
        defaults = atype.validate({})
        if atype.essential:
            return "running", defaults, None
        entry = self.desired.get(atype.name)
        if entry is None:
            return ("running" if atype.autostart else "stopped"), defaults, None
        try:
            plan = atype.validate(entry["args"])
        except ArgError as exc:  # the schema changed since the plan was stored
            agentlog.error("activity.stored_plan_invalid", activity=atype.name, error=str(exc),
                           msg="the stored plan no longer fits this agent's activity; using its defaults")
            plan = defaults
        return entry["state"], plan, entry.get("revision")

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the essential activities, then what the desired state says."""
        with self._lock:
            self._started = True
            for slot in sorted(self._slots.values(), key=lambda s: (not s.type.essential, s.type.name)):
                slot.ensure_thread()
        if self.desired.load_error:
            agentlog.error("activity.state_unreadable", error=self.desired.load_error,
                           msg="the stored activity plan could not be read; running the defaults")

    def request_stop(self) -> None:
        """:meth:`stop_all` without the lock, for a signal handler (which may interrupt a holder of
        the lock); a loop started in the same instant is stopped by the :meth:`stop_all` after it."""
        self._stopping = True
        for slot in list(self._slots.values()):
            ctx = slot.ctx
            if ctx is not None:
                ctx._request_stop()
            slot.wake.set()

    def stop_all(self) -> None:
        """Ask every loop to stop (agent shutdown); returns at once. The desired state is kept."""
        with self._lock:
            self.request_stop()

    def join(self, timeout: float) -> list[str]:
        """Wait up to ``timeout`` s for the loops to return; the names still running after it."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return sorted(s.type.name for s in self._slots.values() if s.thread is not None and s.thread.is_alive())

    def shutdown(self, timeout: float) -> list[str]:
        self.stop_all()
        return self.join(timeout)

    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    # -- control ------------------------------------------------------------------------

    def set(self, name: str, state: str = "running", args: dict | None = None, revision: int | None = None) -> dict:
        """Record and apply the desired state of one activity (what ``activity.set`` does).

        Idempotent: the same request again changes nothing. A ``revision`` lower than the one
        already applied is ignored (``applied: false``), so commands that arrive out of order
        cannot undo a newer plan. Raises :class:`ActivityError` naming what is wrong.
        """
        atype = self.registry.get(name)
        if atype is None:
            known = ", ".join(n for n in self.registry.names() if not self.registry.get(n).essential) or "none"
            raise ActivityError(f"unknown activity {name!r}: this agent (version {__version__}) has {known}")
        if atype.essential:
            raise ActivityError(
                f"activity {name!r} is essential to the agent: it always runs and is not stopped or "
                "re-planned by commands"
            )
        if state not in ("running", "stopped"):
            raise ActivityError(f"state must be 'running' or 'stopped', not {state!r}")
        if args is not None and not isinstance(args, dict):
            raise ActivityError(f"args must be an object, not {type(args).__name__}")
        with self._lock:
            slot = self._slots[name]
            if revision is not None and slot.revision is not None and revision < slot.revision:
                return {"name": name, "applied": False,
                        "reason": f"revision {revision} is older than the applied revision {slot.revision}",
                        "desired": self._desired_of(slot), "health": slot.health(time.monotonic())}
            # stopping without a plan keeps the current one for the next start
            try:
                plan = slot.plan if args is None and state == "stopped" else atype.validate(args or {})
            except ArgError as exc:
                raise ActivityError(f"activity {name!r}: {exc}") from None
            changed = (state, plan) != (slot.desired, slot.plan)
            new_revision = revision if revision is not None else slot.revision
            self.desired.put(name, {"state": state, "args": plan, "revision": new_revision, "set_at": time.time()})
            slot.revision = new_revision
            if self._started:
                slot.apply(state, plan)
            else:
                slot.desired, slot.plan = state, plan
            if changed:
                agentlog.info("activity.set", activity=name, state=state, revision=new_revision)
            return {"name": name, "applied": True, "changed": changed, "desired": self._desired_of(slot),
                    "health": slot.health(time.monotonic())}

    @staticmethod
    def _desired_of(slot: _Slot) -> dict:
        return {"state": slot.desired, "args": slot.plan, "revision": slot.revision}

    # -- health -------------------------------------------------------------------------

    def health(self) -> list[dict]:
        """One entry per activity (see the module docstring), essential ones first."""
        now = time.monotonic()
        with self._lock:
            out = [slot.health(now) for slot in sorted(self._slots.values(),
                                                        key=lambda s: (not s.type.essential, s.type.name))]
        for name in self.desired.names():
            if name not in self._slots:
                entry = self.desired.get(name)
                if entry and entry["state"] == "running":
                    out.append({"name": name, "state": "unavailable", "desired": "running", "restarts": 0,
                                "last_error": f"no such activity in this agent (version {__version__})",
                                "last_error_at": None, "started_at": None, "last_progress_at": None})
        return out

    def state_of(self, name: str) -> dict | None:
        """The health entry of one activity (tests and the ``activity.set`` result)."""
        return next((h for h in self.health() if h["name"] == name), None)
