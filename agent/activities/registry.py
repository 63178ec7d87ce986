"""The registry of activity types: long-running loops of the agent, declared like commands.

A feature adds a module that declares its loop; the supervisor runs it::

    from agent.activities import Arg, activity

    @activity("probe.mesh", args={
        "peers": Arg(list, items=str, default=[]),
        "interval_s": Arg(float, default=1.0, min=0.01, max=3600),
    }, stall_after_s=30)
    def probe_mesh(ctx):
        while ctx.running():
            plan = ctx.plan                 # validated args; a replan replaces it
            ...one round...
            ctx.emit("probe.window", {...})
            ctx.progress(rounds=n)          # health: last progress and a small status
            ctx.sleep(plan["interval_s"])   # wakes early on stop or replan

The loop runs in a thread of its own. It returns when ``ctx.running()`` turns false (a command
stopped it, or the agent is shutting down). Raising, or returning while it should run, is a
crash: the supervisor restarts it with exponential backoff and reports the error in the
heartbeat. Arguments use the command framework's :class:`~agent.commands.Arg` schema; an
activity whose plan has nested parts (lists of objects, cross-field bounds) adds ``check``, a
function of the validated arguments that returns them (normalized) or raises ``ArgError`` naming
the bad field, so ``activity.set`` refuses a bad plan before anything runs.

``essential`` activities are the agent's own flows (heartbeat, command poll, telemetry, the
local socket): always running with their default arguments, never stopped or re-planned by
a command; their names start with ``agent.``. The others follow the desired state that
``activity.set`` commands record (kept in the state directory across restarts); before any
command, an ``autostart`` activity runs with its defaults and any other is stopped.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.commands.registry import Arg, ArgError, validate_args

if TYPE_CHECKING:
    from agent.activities.supervisor import ActivityContext

NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
ESSENTIAL_PREFIX = "agent."

Loop = Callable[["ActivityContext"], None]


class ActivityError(ArgError):
    """A request the supervisor refuses (unknown activity, essential one, bad arguments)."""


@dataclass(frozen=True)
class ActivityType:
    name: str
    run: Loop
    args: Mapping[str, Arg]
    description: str = ""
    essential: bool = False
    autostart: bool = False
    stall_after_s: float | None = None  # health says "stalled" after this long without progress
    check: Callable[[dict], dict] | None = None  # deeper validation of the plan (raises ArgError)

    def validate(self, args: Any) -> dict:
        """The plan: ``args`` checked against the schema, defaults filled in (ArgError names the argument)."""
        plan = validate_args(self.args, args)
        return self.check(plan) if self.check is not None else plan

    def describe(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "essential": self.essential,
            "autostart": self.autostart,
            "args": {k: a.describe() for k, a in self.args.items()},
        }


class ActivityRegistry:
    """Activity types by name. ``default_activities`` is the one the daemon uses."""

    def __init__(self) -> None:
        self._types: dict[str, ActivityType] = {}
        self._lock = threading.Lock()

    def add(self, atype: ActivityType) -> ActivityType:
        if not NAME_RE.match(atype.name) or len(atype.name) > 64:
            raise ValueError(f"activity name {atype.name!r} must be dotted lowercase, like 'probe.mesh'")
        if atype.essential != atype.name.startswith(ESSENTIAL_PREFIX):
            raise ValueError(
                f"activity {atype.name!r}: names starting with {ESSENTIAL_PREFIX!r} are for essential activities, "
                "and essential activities must use one"
            )
        if atype.stall_after_s is not None and atype.stall_after_s <= 0:
            raise ValueError(f"activity {atype.name!r}: stall_after_s must be positive")
        for arg_name in atype.args:
            if not re.match(r"^[a-z_][a-z0-9_]*$", arg_name):
                raise ValueError(f"activity {atype.name!r}: argument name {arg_name!r} is not snake_case")
        try:
            validate_args(atype.args, {})
        except ArgError as exc:
            raise ValueError(f"activity {atype.name!r}: every argument needs a default ({exc})") from None
        with self._lock:
            existing = self._types.get(atype.name)
            if existing is not None and existing.run is not atype.run:
                raise ValueError(f"activity {atype.name!r} is already registered")
            self._types[atype.name] = atype
        return atype

    def register(
        self,
        name: str,
        *,
        args: Mapping[str, Arg] | None = None,
        description: str = "",
        essential: bool = False,
        autostart: bool = False,
        stall_after_s: float | None = None,
        check: Callable[[dict], dict] | None = None,
    ) -> Callable[[Loop], Loop]:
        def decorator(func: Loop) -> Loop:
            self.add(ActivityType(name, func, dict(args or {}), description or (func.__doc__ or "").strip(),
                                  essential, autostart, stall_after_s, check))
            return func

        return decorator

    def get(self, name: str) -> ActivityType | None:
        return self._types.get(name)

    def names(self) -> list[str]:
        return sorted(self._types)

    def describe(self) -> list[dict]:
        return [self._types[n].describe() for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._types


default_activities = ActivityRegistry()


def activity(
    name: str,
    *,
    args: Mapping[str, Arg] | None = None,
    description: str = "",
    essential: bool = False,
    autostart: bool = False,
    stall_after_s: float | None = None,
    check: Callable[[dict], dict] | None = None,
) -> Callable[[Loop], Loop]:
    """Register a loop in the default activity registry (see the module docstring)."""
    return default_activities.register(name, args=args, description=description, essential=essential,
                                       autostart=autostart, stall_after_s=stall_after_s, check=check)
