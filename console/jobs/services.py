"""The one writer of the jobs app: jobs, their snapshots and checkpoints, weight versions, path
events. Called by the telemetry handlers (``console.jobs.telemetry``) with what the nodes'
agents forwarded; each change is published live (``console.live.publish.publish``).

Every function runs in the caller's tenant scope (handlers run in the node's organization).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from console.fleet.models import Node
from console.jobs.models import CaptureKind, Job, JobCapture, PathEvent, PathEventKind, WeightVersion
from console.live.publish import publish

__all__ = ["job_named", "record_capture", "record_heartbeat", "record_path_event", "record_weight_version"]


def job_named(node: Node, name: str) -> Job:
    """The cluster's job of that name, created on first sight; ``node`` becomes its reporting node."""
    job = Job.objects.filter(cluster_id=node.cluster_id, name=name).first()
    if job is None:
        try:
            with transaction.atomic():
                job = Job.objects.create(organization_id=node.organization_id, cluster_id=node.cluster_id,
                                         node=node, name=name)
        except IntegrityError:  # created meanwhile by another batch
            job = Job.objects.get(cluster_id=node.cluster_id, name=name)
    elif job.node_id != node.pk:
        Job.objects.filter(pk=job.pk).update(node=node, updated=timezone.now())
        job.node = node
    return job


def _job_event(job: Job) -> None:
    publish(job.organization_id, job.cluster_id, "job", {
        "id": job.pk, "name": job.name, "step": job.step, "step_time_s": job.step_time_s,
        "world_size": job.world_size, "generation": job.generation,
        "last_seen": job.last_seen.isoformat() if job.last_seen else None,
    }, key=str(job.pk))


# The parts of one heartbeat leave the orchestrator within milliseconds and heartbeats are
# seconds apart: a part older than the stored heartbeat by more than this is from an earlier one.
HEARTBEAT_PART_SPREAD = timedelta(seconds=1)


def record_heartbeat(node: Node, data: dict, at: datetime) -> Job:
    """A ``job.heartbeat`` (or one part of it: a large job's ranks come in several): its ranks
    replace theirs in the job's, unless the part is from an older heartbeat than the stored one."""
    job = job_named(node, data["job"])
    part = data.get("ranks") or []
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.last_seen is not None and at < job.last_seen - HEARTBEAT_PART_SPREAD:
            return job
        world_size = data.get("world_size") or len(part)
        rows = {r["rank"]: r for r in (job.ranks or []) if r.get("rank", world_size) < world_size}
        if "world_size" not in data:  # a whole-job heartbeat of an older runtime: it replaces all
            rows = {}
        rows.update((r["rank"], r) for r in part if r["rank"] < world_size)
        ranks = [rows[r] for r in sorted(rows)]
        steps = [r["step"] for r in ranks if r.get("step") is not None]
        job.ranks, job.world_size = ranks, world_size
        job.step = min(steps) if steps else 0
        job.step_time_s = max((r.get("step_time_s") or 0.0 for r in ranks), default=0.0)
        job.generation = data.get("generation") or 0
        job.last_seen = max(at, job.last_seen) if job.last_seen else at
        job.save(update_fields=["ranks", "world_size", "step", "step_time_s", "generation", "last_seen", "updated"])
    _job_event(job)
    return job


def record_capture(node: Node, kind: str, data: dict, at: datetime) -> JobCapture | None:
    """A ``job.snapshot`` or ``job.checkpoint``; a repeat of one already stored changes nothing."""
    job = job_named(node, data["job"])
    if kind == CaptureKind.SNAPSHOT:
        identifier, paused = data["id"], data.get("paused_s")
    else:
        identifier, paused = data.get("save_id") or data["path"], data.get("stall_s")
    if JobCapture.objects.filter(job=job, kind=kind, identifier=identifier).exists():
        return None
    try:
        with transaction.atomic():
            capture = JobCapture.objects.create(
                organization_id=job.organization_id, cluster_id=job.cluster_id, job=job, kind=kind,
                identifier=identifier, step=data.get("step"), bytes=data.get("bytes") or 0, paused_s=paused,
                duration_s=data.get("duration_s"), path=data.get("path") or "", taken_at=at,
                undiscovered=data.get("undiscovered") or [])
    except IntegrityError:
        return None
    publish(job.organization_id, job.cluster_id, "job_capture", {
        "id": capture.pk, "job": job.pk, "kind": kind, "identifier": identifier, "step": capture.step,
        "bytes": capture.bytes, "path": capture.path, "taken_at": at.isoformat(),
    }, key=str(capture.pk))
    return capture


def record_weight_version(node: Node, data: dict, at: datetime) -> WeightVersion | None:
    """A ``weights.version`` delivered to the rollout replicas. A publisher outside ``lockstep
    run`` names no job: it is shown as a job named after the publisher."""
    publisher = data.get("publisher") or ""
    job = job_named(node, data.get("job") or f"publisher-{publisher[:12]}")
    if WeightVersion.objects.filter(job=job, publisher=publisher, version=data["version"]).exists():
        return None
    try:
        with transaction.atomic():
            wv = WeightVersion.objects.create(
                organization_id=job.organization_id, cluster_id=job.cluster_id, job=job, publisher=publisher,
                version=data["version"], bytes=data.get("bytes") or 0, duration_s=data.get("duration_s"),
                replicas=data.get("replicas") or {}, holders=data.get("holders") or {}, pushed_at=at)
    except IntegrityError:
        return None
    publish(job.organization_id, job.cluster_id, "weight_version", {
        "id": wv.pk, "job": job.pk, "version": wv.version, "bytes": wv.bytes, "replicas": wv.replicas,
        "pushed_at": at.isoformat(),
    }, key=str(wv.pk))
    return wv


def record_path_event(node: Node, kind: str, data: dict, at: datetime) -> PathEvent:
    """The NCCL plugin's ``nccl.failover`` / ``nccl.failback`` on ``node``."""
    event = PathEvent.objects.create(
        organization_id=node.organization_id, cluster_id=node.cluster_id, node=node,
        kind=PathEventKind(kind), comm=data.get("comm") or "", rank=data.get("rank"),
        from_device=data.get("from") or "", to_device=data.get("to") or "", reason=data.get("reason") or "", ts=at)
    publish(node.organization_id, node.cluster_id, "path_event", {
        "id": event.pk, "node": node.pk, "kind": kind, "comm": event.comm, "rank": event.rank,
        "from": event.from_device, "to": event.to_device, "ts": at.isoformat(),
    }, key=str(event.pk))
    return event
