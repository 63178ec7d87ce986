"""`activity.set`: start, stop or re-plan one of a node's agent activities (docs/agent-protocol.md).

The agent validates the plan against the activity's own schema (it knows which activities its
version has); the console checks the shape, bounds the size and stamps a `revision` (the time
of issue, in ns) so that commands that reach the agent out of order never undo a newer plan.
Activities named `agent.*` are the agent's own flows and always run: they are refused here.

An activity whose plan the console can check registers a serializer for it with
:func:`register_plan` (e.g. ``console/commands/probemesh.py``): the plan is then validated (and
normalized) by it, errors named under ``args``, and bounded by its own size.
"""

from __future__ import annotations

import json
import time

from rest_framework import serializers

from console.commands.registry import CommandType, register

NAME_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)+$"
PLAN_MAX_BYTES = 16 * 1024

_plans: dict[str, tuple[type[serializers.Serializer], int]] = {}


def register_plan(name: str, serializer: type[serializers.Serializer], max_bytes: int = PLAN_MAX_BYTES) -> None:
    """Validate the plans of activity `name` with `serializer` (bounded to `max_bytes` of JSON)."""
    existing = _plans.get(name)
    if existing is not None and existing != (serializer, max_bytes):
        raise ValueError(f"activity {name!r} already has a plan serializer")
    _plans[name] = (serializer, max_bytes)


class ActivitySetArgs(serializers.Serializer):
    name = serializers.RegexField(NAME_PATTERN, max_length=64, error_messages={
        "invalid": "must be a dotted lowercase activity name, like 'probe.mesh'"})
    state = serializers.ChoiceField(choices=["running", "stopped"], default="running")
    args = serializers.JSONField(required=False, help_text="The plan: the activity's arguments (omitted: its defaults).")
    revision = serializers.IntegerField(min_value=0, required=False,
                                        help_text="Defaults to the time of issue in ns; older ones are ignored.")

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"args": "must be an object"})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: "unknown argument" for key in unknown})
        return super().to_internal_value(data)

    def validate_name(self, value: str) -> str:
        if value.startswith("agent."):
            raise serializers.ValidationError(
                "activities named agent.* are the agent's own flows; they always run and take no commands")
        return value

    def validate_args(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("must be an object")
        return value

    def validate(self, data):
        if data["state"] == "stopped" and "args" in data:
            raise serializers.ValidationError({"args": "a stopped activity takes no plan"})
        if "args" in data:
            serializer, max_bytes = _plans.get(data["name"], (None, PLAN_MAX_BYTES))
            if len(json.dumps(data["args"], separators=(",", ":"))) > max_bytes:
                raise serializers.ValidationError({"args": f"the plan is larger than {max_bytes} bytes"})
            if serializer is not None:
                plan = serializer(data=data["args"])
                if not plan.is_valid():
                    raise serializers.ValidationError({"args": _flatten(plan.errors)})
                data["args"] = _plain(plan.validated_data)
        data.setdefault("revision", time.time_ns())
        return data


def _flatten(errors, prefix: str = "") -> str:
    """DRF's nested errors as one sentence naming each field: ``nics[0].address: ...``."""
    if isinstance(errors, dict):
        parts = []
        for key, value in errors.items():
            name = key if key != "non_field_errors" else ""
            nested = prefix and name and not name.startswith(prefix)  # keys may already be full paths
            sub = f"{prefix}.{name}" if nested else name or prefix
            parts.append(_flatten(value, sub))
        return "; ".join(p for p in parts if p)
    if isinstance(errors, list):
        if all(isinstance(e, str) for e in errors):
            return f"{prefix}: {' '.join(errors)}" if prefix else " ".join(errors)
        return "; ".join(_flatten(e, prefix) for e in errors)
    return f"{prefix}: {errors}" if prefix else str(errors)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


register(
    CommandType(
        name="activity.set",
        description="Start, stop or re-plan an agent activity (probe mesh, clock sync, ...); the agent keeps "
                    "the desired state across restarts and reports each activity's health in its heartbeats.",
        args_serializer=ActivitySetArgs,
        timeout_s=30,
    )
)
