"""The registry of command types: name, argument schema, handler, timeout.

A feature adds a module that registers its commands; the transport never
changes::

    from agent.commands import Arg, command

    @command("clock.probe", timeout_s=30, args={
        "peer": Arg(str, required=True),
        "count": Arg(int, default=16, min=1, max=1000),
    })
    def clock_probe(args, ctx):
        ...                      # ctx.deadline, ctx.cancelled, ctx.emit(kind, data)
        return {"samples": [...]}   # a JSON object: the command's result

Handlers are plain functions of (validated args, context) returning a JSON
object. They run in a worker thread; a handler that raises, returns a
non-object or outlives its timeout makes the command ``failed`` with a
sentence, and never wedges the daemon. Long handlers should look at
``ctx.cancelled`` (set on timeout and shutdown) and stop early.

The argument schema is deliberately small and explicit (no Django, no
jsonschema): each argument is an :class:`Arg` with a Python type
(``str``, ``int``, ``float``, ``bool``, ``list``, ``dict``), required or a
default, and optional bounds, choices, list item type and length limits.
Unknown arguments are refused. Every error names the argument.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
_MISSING = object()
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list", dict: "an object"}


class ArgError(ValueError):
    """Arguments do not match the schema; the message names the argument."""


@dataclass(frozen=True)
class Arg:
    type: type
    required: bool = False
    default: Any = None
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    items: type | None = None
    max_len: int | None = None
    help: str = ""

    def __post_init__(self) -> None:
        if self.type not in _TYPE_NAMES:
            raise TypeError(f"Arg type must be one of {', '.join(t.__name__ for t in _TYPE_NAMES)}")
        if self.items is not None and (self.type is not list or self.items not in _TYPE_NAMES):
            raise TypeError("Arg items is only for list arguments, with a simple item type")

    def describe(self) -> dict:
        out: dict[str, Any] = {"type": self.type.__name__, "required": self.required}
        if not self.required:
            out["default"] = self.default
        for key in ("choices", "min", "max", "max_len", "help"):
            value = getattr(self, key)
            if value not in (None, ""):
                out[key] = list(value) if key == "choices" else value
        if self.items is not None:
            out["items"] = self.items.__name__
        return out


def _check_type(expected: type, value: Any) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)


def validate_args(schema: Mapping[str, Arg], args: Any) -> dict:
    """Check ``args`` against ``schema``; return them with defaults filled in."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ArgError(f"args must be an object, not {type(args).__name__}")
    unknown = sorted(set(args) - set(schema))
    if unknown:
        known = ", ".join(sorted(schema)) or "none"
        raise ArgError(f"unknown argument {unknown[0]!r} (this command takes: {known})")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        value = args.get(name, _MISSING)
        if value is _MISSING or value is None:
            if spec.required:
                raise ArgError(f"argument {name!r} is required")
            out[name] = spec.default
            continue
        if not _check_type(spec.type, value):
            raise ArgError(f"argument {name!r} must be {_TYPE_NAMES[spec.type]}, not {type(value).__name__}")
        if spec.type is float:
            value = float(value)
        if spec.choices is not None and value not in spec.choices:
            allowed = ", ".join(repr(c) for c in spec.choices)
            raise ArgError(f"argument {name!r} must be one of {allowed}, not {value!r}")
        if spec.min is not None and isinstance(value, (int, float)) and value < spec.min:
            raise ArgError(f"argument {name!r} must be at least {spec.min:g}, not {value!r}")
        if spec.max is not None and isinstance(value, (int, float)) and value > spec.max:
            raise ArgError(f"argument {name!r} must be at most {spec.max:g}, not {value!r}")
        if spec.max_len is not None and isinstance(value, (str, list, dict)) and len(value) > spec.max_len:
            raise ArgError(f"argument {name!r} is longer than {spec.max_len}")
        if spec.items is not None:
            for i, item in enumerate(value):
                if not _check_type(spec.items, item):
                    raise ArgError(
                        f"argument {name}[{i}] must be {_TYPE_NAMES[spec.items]}, not {type(item).__name__}"
                    )
        out[name] = value
    return out


@dataclass
class CommandContext:
    """What a handler gets beside its arguments."""

    command_id: str
    type: str
    attempt: int
    deadline: float  # time.monotonic() value after which the command has timed out
    cancelled: threading.Event = field(default_factory=threading.Event)
    emit: Callable[..., None] | None = None  # telemetry: emit(kind, data)
    services: Mapping[str, Any] = field(default_factory=dict)  # daemon-provided helpers (inventory, ...)

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


Handler = Callable[[dict, CommandContext], Any]


@dataclass(frozen=True)
class CommandType:
    name: str
    handler: Handler
    args: Mapping[str, Arg]
    timeout_s: float
    description: str = ""

    def describe(self) -> dict:
        return {
            "name": self.name,
            "timeout_s": self.timeout_s,
            "description": self.description,
            "args": {k: a.describe() for k, a in self.args.items()},
        }


class Registry:
    """Command types by name. ``default_registry`` is the one the daemon uses."""

    def __init__(self) -> None:
        self._types: dict[str, CommandType] = {}
        self._lock = threading.Lock()

    def add(self, ctype: CommandType) -> CommandType:
        if not _NAME_RE.match(ctype.name) or len(ctype.name) > 64:
            raise ValueError(f"command type name {ctype.name!r} must be dotted lowercase, like 'inventory.refresh'")
        if not (0 < ctype.timeout_s <= 86400):
            raise ValueError(f"command type {ctype.name!r}: timeout_s must be in (0, 86400]")
        for arg_name in ctype.args:
            if not re.match(r"^[a-z_][a-z0-9_]*$", arg_name):
                raise ValueError(f"command type {ctype.name!r}: argument name {arg_name!r} is not snake_case")
        with self._lock:
            existing = self._types.get(ctype.name)
            if existing is not None and existing.handler is not ctype.handler:
                raise ValueError(f"command type {ctype.name!r} is already registered")
            self._types[ctype.name] = ctype
        return ctype

    def register(
        self, name: str, *, timeout_s: float, args: Mapping[str, Arg] | None = None, description: str = ""
    ) -> Callable[[Handler], Handler]:
        def decorator(func: Handler) -> Handler:
            self.add(CommandType(name, func, dict(args or {}), float(timeout_s), description or (func.__doc__ or "")))
            return func

        return decorator

    def get(self, name: str) -> CommandType | None:
        return self._types.get(name)

    def names(self) -> list[str]:
        return sorted(self._types)

    def describe(self) -> list[dict]:
        return [self._types[n].describe() for n in self.names()]

    def __contains__(self, name: object) -> bool:
        return name in self._types


default_registry = Registry()


def command(
    name: str, *, timeout_s: float, args: Mapping[str, Arg] | None = None, description: str = ""
) -> Callable[[Handler], Handler]:
    """Register a handler in the default registry (see the module docstring)."""
    return default_registry.register(name, timeout_s=timeout_s, args=args, description=description)
