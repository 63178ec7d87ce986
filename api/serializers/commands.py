from __future__ import annotations

from rest_framework import serializers

from api.serializers.base import StrictModelSerializer
from console.commands import registry
from console.commands.models import Command
from console.fleet.models import Node


class CommandSerializer(StrictModelSerializer):
    # Resolved in the caller's tenant scope (the default manager): another tenant's node is "does not exist".
    node = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all())
    type = serializers.CharField(max_length=64, help_text="A registered command type; see /api/v1/command-types/.")
    args = serializers.JSONField(required=False, default=dict)
    idempotency_key = serializers.CharField(max_length=100, required=False, allow_null=True)

    class Meta:
        model = Command
        fields = ["id", "organization", "cluster", "node", "type", "args", "state", "attempt", "max_attempts",
                  "timeout_s", "idempotency_key", "created", "delivered_at", "completed_at", "result", "error"]
        read_only_fields = ["id", "organization", "cluster", "state", "attempt", "max_attempts", "timeout_s",
                            "created", "delivered_at", "completed_at", "result", "error"]
        validators = []  # a repeated idempotency key returns the first command (commands.services.issue_command)

    def validate_type(self, value: str) -> str:
        try:
            registry.get(value)
        except registry.UnknownCommandType as exc:
            raise serializers.ValidationError(exc.detail) from None
        return value


class CommandTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    timeout_s = serializers.IntegerField()
