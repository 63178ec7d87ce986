"""Built-in command types: ``inventory.refresh``, ``node.health`` and ``activity.set``.

Their handlers use the daemon's services (its host paths, NVML module and state
directory) when run by the daemon, and this host's defaults otherwise.
"""

from __future__ import annotations

from agent.commands.registry import Arg, CommandContext, command
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


@command("activity.set", timeout_s=30, args={
    "name": Arg(str, required=True, max_len=64, help="the activity, e.g. 'probe.mesh'"),
    "state": Arg(str, choices=("running", "stopped"), default="running"),
    "args": Arg(dict, default=None, help="the plan: the activity's arguments (omitted: its defaults)"),
    "revision": Arg(int, default=None, min=0, help="older revisions than the applied one are ignored"),
}, description="Start, stop or re-plan an activity; the desired state survives agent restarts.")
def activity_set(args: dict, ctx: CommandContext) -> dict:
    supervisor = ctx.services.get("activities")
    if supervisor is None:
        raise RuntimeError("this agent runs no activity supervisor")
    return supervisor.set(args["name"], args["state"], args["args"], args["revision"])
