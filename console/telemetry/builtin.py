"""Telemetry kinds the console itself understands (see docs/agent-protocol.md §5).

- `node.health`: the agent's periodic health summary (the same document as the `node.health`
  command's result); the newest one becomes the node's health report.
- `event.<kind>`: events processes on the node sent to the agent's local socket, forwarded
  (the kinds of the local-socket contract, docs/seams.md); stored, bounded, for features to
  handle (they attach handlers, or register a stricter validator under the same name).
"""

from __future__ import annotations

from console.telemetry import kinds
from console.telemetry.kinds import StoredRecords, TelemetryKind

_gpu = kinds.shape({"index": kinds.integer(0, 1023), "temperature_c": kinds.number(-50, 200),
                    "ecc_uncorrected": kinds.integer(0)}, limits=kinds.bounded(max_bytes=8192))
_nic = kinds.shape({"device": kinds.text(64), "link_state": kinds.text(16), "rx_errors": kinds.integer(0),
                    "tx_errors": kinds.integer(0)}, limits=kinds.bounded(max_bytes=4096))



NODE_HEALTH = kinds.shape(
    {
        "load1": kinds.number(0),
        "memory_available_bytes": kinds.integer(0),
        "disk_free_bytes": kinds.integer(0),
        "uptime_s": kinds.number(0),
        "gpus": kinds.list_of(kinds.nested(_gpu), 1024),
        "nics": kinds.list_of(kinds.nested(_nic), 1024),
        "ok": kinds.boolean(),
        "problems": kinds.list_of(kinds.text(1000), 200),
    },
    limits=kinds.bounded(max_bytes=256 * 1024, max_items=1024, max_keys=128),
)


def _newest_health_becomes_the_report(stored: StoredRecords) -> None:
    from console.fleet import services

    newest = max(stored.records, key=lambda record: record.ts)
    services.store_health_report(stored.node_id, newest.data, newest.ts)


kinds.register(TelemetryKind(
    name="node.health",
    description="The agent's periodic health summary: load, memory, disk, GPU temperatures and ECC, NIC errors, "
                "problems in words.",
    validate=NODE_HEALTH,
    handlers=[_newest_health_becomes_the_report],
))

# The local socket's event kinds (the contract in docs/seams.md), forwarded as `event.<kind>`.
EVENT_KINDS = (
    "nccl.failover", "nccl.failback", "nccl.path_state",
    "job.heartbeat", "job.rank_lost", "job.migration_started", "job.migration_finished", "job.snapshot",
    "job.checkpoint",
    "weights.version",
)
EVENT_LIMITS = kinds.bounded(max_bytes=8 * 1024, max_depth=5, max_keys=64, max_items=128, max_string=1024)


def _event(data: dict) -> dict:
    EVENT_LIMITS(data, "")
    return data


for _name in EVENT_KINDS:
    kinds.register(TelemetryKind(
        name=f"event.{_name}",
        description=f"A {_name} event a process on the node sent to the agent's local socket, forwarded by the agent.",
        validate=_event, generic=True,
    ))
