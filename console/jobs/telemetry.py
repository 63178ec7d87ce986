"""The event kinds the Lockstep runtime and the NCCL plugin send the node agent's local socket,
forwarded as ``event.<kind>`` (docs/agent-protocol.md): stricter validators than the console's
generic one (``console.telemetry.builtin``), and the handlers that keep the jobs app current.

Fields are type-checked when present; ``job`` is required where the record is about a job. A
record without what a handler needs (a snapshot without its id) is stored as telemetry and not
shown as a job's.
"""

from __future__ import annotations

from console.fleet.models import Node
from console.jobs import services
from console.jobs.models import CaptureKind
from console.telemetry import kinds
from console.telemetry.builtin import EVENT_LIMITS
from console.telemetry.kinds import StoredRecords, TelemetryKind

JOB_NAME = kinds.text(64)




_RANK = kinds.shape({"rank": kinds.integer(0, 1 << 20), "step": kinds.integer(0), "step_time_s": kinds.number(0),
                     "node": kinds.integer(0, 1 << 20), "state": kinds.text(32)},
                    required=("rank",), limits=kinds.bounded(max_bytes=1024))
_HOLDER = kinds.shape({"received": kinds.integer(0), "applied": kinds.integer(0), "sending": kinds.integer(0)},
                      limits=kinds.bounded(max_bytes=512))

# What libnccl-net-lockstep.so sends on a failover or failback (nccl_plugin/README.md, "Events").
NCCL_SWITCH = kinds.shape(
    {"comm": kinds.text(64), "rank": kinds.integer(0, 1 << 20), "role": kinds.text(16),
     "device": kinds.integer(0, 1 << 16), "from": kinds.text(64), "to": kinds.text(64), "reason": kinds.text(255),
     "unacked_chunks": kinds.integer(0), "silent_ms": kinds.integer(0)},
    limits=EVENT_LIMITS)

VALIDATORS = {
    # A heartbeat carries a part of the ranks (the local socket's 64 KiB line is its bound) and the
    # job's world size; a job of more ranks sends several parts.
    "job.heartbeat": kinds.shape(
        {"job": JOB_NAME, "generation": kinds.integer(0), "world_size": kinds.integer(1, 1 << 20),
         "ranks": kinds.list_of(kinds.nested(_RANK), 1024)},
        required=("job",), limits=kinds.bounded(max_bytes=64 * 1024, max_items=1024)),
    "job.snapshot": kinds.shape(
        {"job": JOB_NAME, "id": kinds.text(64), "step": kinds.integer(0), "bytes": kinds.integer(0),
         "paused_s": kinds.number(0), "duration_s": kinds.number(0), "reason": kinds.text(32),
         "path": kinds.text(1024), "ranks": kinds.integer(0), "undiscovered": kinds.list_of(kinds.text(1000), 64)},
        required=("job",), limits=EVENT_LIMITS),
    "job.checkpoint": kinds.shape(
        {"job": JOB_NAME, "path": kinds.text(1024), "step": kinds.integer(0), "save_id": kinds.text(128),
         "world_size": kinds.integer(1), "bytes": kinds.integer(0), "stall_s": kinds.number(0),
         "duration_s": kinds.number(0)},
        limits=EVENT_LIMITS),
    "weights.version": kinds.shape(
        {"job": JOB_NAME, "publisher": kinds.text(64), "version": kinds.integer(0), "bytes": kinds.integer(0),
         "duration_s": kinds.number(0), "replicas": kinds.mapping_of(kinds.text(300), 128),
         "holders": kinds.mapping_of(kinds.nested(_HOLDER), 128)},
        limits=EVENT_LIMITS),
    "nccl.failover": NCCL_SWITCH,
    "nccl.failback": NCCL_SWITCH,
}

DESCRIPTIONS = {
    "job.heartbeat": "A lockstep run job's orchestrator, every few seconds: generation, per-rank step and step time.",
    "job.snapshot": "A job snapshot was published: id, step, size, training pause, duration, where it is stored.",
    "job.checkpoint": "An application checkpoint (lockstep.checkpoint.save) was published: path, step, size, stall.",
    "weights.version": "A weight version reached the rollout replicas: version, bytes, duration, who holds which.",
    "nccl.failover": "The NCCL plugin moved a communicator's traffic off a failing NIC.",
    "nccl.failback": "The NCCL plugin moved a communicator's traffic back to a recovered NIC.",
}

for _name, _validate in VALIDATORS.items():
    # Only over the console's generic stand-in: a feature that registered its own shape first
    # (the NCCL plugin's app, say) keeps it, and the handlers below attach to it.
    if kinds.get(f"event.{_name}").generic:
        kinds.register(TelemetryKind(name=f"event.{_name}", description=DESCRIPTIONS[_name], validate=_validate))


def _node(stored: StoredRecords) -> Node:
    return Node.objects.get(pk=stored.node_id)


@kinds.handler("event.job.heartbeat")
def _heartbeats(stored: StoredRecords) -> None:
    newest: dict = {}  # (job, first rank of the part) -> the newest such part in the batch
    for record in stored.records:
        job = record.data.get("job")
        key = (job, min((r["rank"] for r in record.data.get("ranks") or []), default=0))
        if job and (key not in newest or record.ts > newest[key].ts):
            newest[key] = record
    node = _node(stored)
    for record in newest.values():
        services.record_heartbeat(node, record.data, record.ts)


@kinds.handler("event.job.snapshot")
def _snapshots(stored: StoredRecords) -> None:
    node = _node(stored)
    for record in stored.records:
        if record.data.get("job") and record.data.get("id"):
            services.record_capture(node, CaptureKind.SNAPSHOT, record.data, record.ts)


@kinds.handler("event.job.checkpoint")
def _checkpoints(stored: StoredRecords) -> None:
    node = _node(stored)
    for record in stored.records:
        if record.data.get("job") and (record.data.get("save_id") or record.data.get("path")):
            services.record_capture(node, CaptureKind.CHECKPOINT, record.data, record.ts)


@kinds.handler("event.weights.version")
def _weight_versions(stored: StoredRecords) -> None:
    node = _node(stored)
    for record in stored.records:
        if record.data.get("version") is not None and (record.data.get("job") or record.data.get("publisher")):
            services.record_weight_version(node, record.data, record.ts)


@kinds.handler("event.nccl.failover")
def _failovers(stored: StoredRecords) -> None:
    node = _node(stored)
    for record in stored.records:
        services.record_path_event(node, "failover", record.data, record.ts)


@kinds.handler("event.nccl.failback")
def _failbacks(stored: StoredRecords) -> None:
    node = _node(stored)
    for record in stored.records:
        services.record_path_event(node, "failback", record.data, record.ts)
