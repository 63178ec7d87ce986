"""Command types every agent understands (see docs/agent-protocol.md)."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import serializers

from console.commands.registry import CommandType, register


class NoArguments(serializers.Serializer):
    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("must be an object")
        if data:
            raise serializers.ValidationError({key: "this command takes no arguments" for key in data})
        return {}


def _apply_inventory(command) -> None:
    from console.fleet import services

    services.apply_inventory(command.node, command.result)


def _store_health(command) -> None:
    from console.fleet import services

    report = command.result if isinstance(command.result, dict) else {}
    services.store_health_report(command.node_id, report, timezone.now())


register(
    CommandType(
        name="inventory.refresh",
        description="Re-read GPUs, NICs, PCIe affinity and host facts; the result replaces the inventory.",
        args_serializer=NoArguments,
        timeout_s=60,
        on_success=_apply_inventory,
    )
)
register(
    CommandType(
        name="node.health",
        description="A health summary: load, memory, disk, GPU temperatures and ECC, NIC errors.",
        args_serializer=NoArguments,
        timeout_s=30,
        on_success=_store_health,
    )
)
