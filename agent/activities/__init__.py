"""Activities: the agent's long-running loops, declared like commands and run by one supervisor.

Importing this package registers nothing; ``agent.activities.builtin`` declares the agent's
own flows (heartbeat, command poll, results, telemetry, inventory, health, the local socket)
and ``agent.commands.load_modules`` imports it. Features declare theirs with :func:`activity`
in a module listed in ``LOCKSTEP_COMMAND_MODULES`` (or in ``agent.commands.BUILTIN_MODULES``
once they ship), and the console starts, stops and re-plans them with ``activity.set``.
"""

from __future__ import annotations

from agent.activities.desired import DesiredState
from agent.activities.registry import (
    ActivityError,
    ActivityRegistry,
    ActivityType,
    activity,
    default_activities,
)
from agent.activities.supervisor import ActivityContext, Supervisor
from agent.commands.registry import Arg

__all__ = [
    "ActivityContext",
    "ActivityError",
    "ActivityRegistry",
    "ActivityType",
    "Arg",
    "DesiredState",
    "Supervisor",
    "activity",
    "default_activities",
]
