"""Built-in command types: ``inventory.refresh`` and ``node.health``.

Their handlers use the daemon's services (its host paths, NVML module and state
directory) when run by the daemon, and this host's defaults otherwise.
"""

from __future__ import annotations

from agent.commands.registry import CommandContext, command
from agent.health import node_health
from agent.inventory import HostPaths, collect


@command("inventory.refresh", timeout_s=60, description="Collect the lockstep.inventory/v1 document.")
def inventory_refresh(args: dict, ctx: CommandContext) -> dict:
    service = ctx.services.get("inventory")
    return service() if service else collect()


@command("node.health", timeout_s=30, description="Summarise load, memory, disk, GPU and NIC health.")
def node_health_command(args: dict, ctx: CommandContext) -> dict:
    service = ctx.services.get("health")
    return service() if service else node_health(HostPaths(), None)
