"""Command framework: the registry of command types and the built-in ones.

Importing this package registers the built-in commands (``inventory.refresh``,
``node.health``) in :data:`default_registry`. Features add a module that calls
:func:`command` at import time; list extra modules in ``LOCKSTEP_COMMAND_MODULES``
(or import them from :data:`BUILTIN_MODULES` once they ship with the agent).
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

# Modules that ship with the agent and register command types when imported.
BUILTIN_MODULES = ("agent.commands.builtin", "agent.audit.commands")


def load_modules(extra: tuple[str, ...] | list[str] = ()) -> None:
    """Import the built-in command modules and ``extra`` ones (each registers its types)."""
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
