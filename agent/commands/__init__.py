"""Command framework: the registry of command types and the built-in ones.

:func:`load_modules` registers the built-in commands (``inventory.refresh``, ``node.health``,
``activity.set``) in :data:`default_registry` and the built-in activities in
``agent.activities.default_activities``. Features add a module that calls :func:`command`
(and ``agent.activities.activity``) at import time; list extra modules in
``LOCKSTEP_COMMAND_MODULES`` (or in :data:`BUILTIN_MODULES` once they ship with the agent).
"""

from __future__ import annotations

import importlib

from agent.commands.registry import (
    Arg,
    ArgError,
    CommandContext,
    CommandType,
    Registry,
    command,
    default_registry,
    validate_args,
)

# Modules that ship with the agent and register command types or activities when imported.
BUILTIN_MODULES = ("agent.commands.builtin", "agent.activities.builtin", "agent.audit.commands",
                   "agent.probemesh.activity", "agent.clocksync.activity")


def load_modules(extra: tuple[str, ...] | list[str] = ()) -> None:
    """Import the built-in modules and ``extra`` ones (each registers its commands and activities)."""
    for name in (*BUILTIN_MODULES, *extra):
        importlib.import_module(name)


__all__ = [
    "Arg",
    "ArgError",
    "BUILTIN_MODULES",
    "CommandContext",
    "CommandType",
    "Registry",
    "command",
    "default_registry",
    "load_modules",
    "validate_args",
]
