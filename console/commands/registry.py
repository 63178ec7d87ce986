"""The console's registry of command types.

A feature that needs agents to do something registers a `CommandType` here (from its app's
`ready()`): a name, an argument serializer that validates what operators send, a timeout, and
an optional hook that applies a successful result (e.g. storing an inventory). The transport
(claiming, leases, results) never changes when a type is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rest_framework import serializers

from console.core.errors import Invalid, flatten

if TYPE_CHECKING:
    from console.commands.models import Command


class UnknownCommandType(Invalid):
    def __init__(self, detail: str):
        super().__init__(detail, field="type")


@dataclass(frozen=True)
class CommandType:
    name: str
    description: str
    args_serializer: type[serializers.Serializer]
    timeout_s: int = 60
    # Called inside the result's transaction when the agent reports success.
    on_success: Callable[[Command], None] | None = None

    def validate_args(self, args) -> dict:
        """Validated, normalized arguments; raises Invalid naming the field (`args.<field>`)."""
        serializer = self.args_serializer(data=args if args is not None else {})
        if not serializer.is_valid():
            fields = {key.replace("args.non_field_errors", "args"): problem
                      for key, problem in flatten(serializer.errors, "args").items()}
            raise Invalid(f"The arguments of {self.name} are not valid: "
                          + "; ".join(f"{k}: {v}" for k, v in fields.items()), fields=fields)
        return dict(serializer.validated_data)


_types: dict[str, CommandType] = {}


def register(command_type: CommandType) -> CommandType:
    existing = _types.get(command_type.name)
    if existing is not None and existing != command_type:
        raise ValueError(f"command type {command_type.name!r} is already registered")
    _types[command_type.name] = command_type
    return command_type


def get(name: str) -> CommandType:
    try:
        return _types[name]
    except KeyError:
        known = ", ".join(sorted(_types))
        raise UnknownCommandType(f"unknown command type {name!r} (known: {known})") from None


def names() -> list[str]:
    return sorted(_types)
