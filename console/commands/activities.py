"""`activity.set`: start, stop or re-plan one of a node's agent activities (docs/agent-protocol.md).

The agent validates the plan against the activity's own schema (it knows which activities its
version has); the console checks the shape, bounds the size and stamps a `revision` (the time
of issue, in ns) so that commands that reach the agent out of order never undo a newer plan.
Activities named `agent.*` are the agent's own flows and always run: they are refused here.
"""

from __future__ import annotations

import json
import time

from rest_framework import serializers

from console.commands.registry import CommandType, register

NAME_PATTERN = r"^[a-z0-9_]+(\.[a-z0-9_]+)+$"
PLAN_MAX_BYTES = 16 * 1024


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
        if len(json.dumps(value, separators=(",", ":"))) > PLAN_MAX_BYTES:
            raise serializers.ValidationError(f"the plan is larger than {PLAN_MAX_BYTES} bytes")
        return value

    def validate(self, data):
        if data["state"] == "stopped" and "args" in data:
            raise serializers.ValidationError({"args": "a stopped activity takes no plan"})
        data.setdefault("revision", time.time_ns())
        return data


register(
    CommandType(
        name="activity.set",
        description="Start, stop or re-plan an agent activity (probe mesh, clock sync, ...); the agent keeps "
                    "the desired state across restarts and reports each activity's health in its heartbeats.",
        args_serializer=ActivitySetArgs,
        timeout_s=30,
    )
)
