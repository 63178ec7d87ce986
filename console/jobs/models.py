"""Training jobs run under ``lockstep run``, as the nodes' agents report them (agent-forwarded
events, docs/agent-protocol.md): the job, its snapshots and checkpoints, the weight versions it
pushed to rollout replicas, and the NCCL plugin's path failovers on a node."""

from __future__ import annotations

from django.db import models

from console.core.models import ClusterOwnedModel

__all__ = ["Job", "JobCapture", "CaptureKind", "PathEvent", "PathEventKind", "WeightVersion"]


class Job(ClusterOwnedModel):
    """One job (by name, within a cluster); ``node`` is the node whose agent reports it (the one
    running its orchestrator). A restored job continues the row of the job it restores."""

    tenant_parents = ("node",)

    node = models.ForeignKey(
        to="fleet.Node",
        on_delete=models.CASCADE,
        related_name="jobs",
        verbose_name="reporting node",
    )
    name = models.CharField(
        verbose_name="name",
        max_length=64,
    )
    generation = models.PositiveIntegerField(
        verbose_name="process-group generation",
        default=0,
    )
    world_size = models.PositiveIntegerField(
        verbose_name="ranks",
        default=0,
    )
    step = models.PositiveBigIntegerField(
        verbose_name="step",
        default=0,
        help_text="The lowest step of its ranks at the last heartbeat.",
    )
    step_time_s = models.FloatField(
        verbose_name="step time (s)",
        default=0.0,
    )
    ranks = models.JSONField(
        verbose_name="ranks",
        default=list,
        help_text="Per rank at the last heartbeat: rank, node index, state, step, step time.",
    )
    last_seen = models.DateTimeField(
        verbose_name="last heartbeat",
        null=True,
        blank=True,
    )

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="jobs_job_unique_cluster_name"),
            models.UniqueConstraint(fields=["id", "cluster", "organization"], name="jobs_job_unique_id_placement"),
        ]

    def __str__(self) -> str:
        return self.name


class CaptureKind(models.TextChoices):
    SNAPSHOT = "snapshot", "Snapshot"
    CHECKPOINT = "checkpoint", "Checkpoint"


class JobCapture(ClusterOwnedModel):
    """A snapshot (``lockstep snapshot``, every rank's state, no code change) or an application
    checkpoint (``lockstep.checkpoint.save``) of a job."""

    tenant_parents = ("job",)

    job = models.ForeignKey(
        to=Job,
        on_delete=models.CASCADE,
        related_name="captures",
        verbose_name="job",
    )
    kind = models.CharField(
        verbose_name="kind",
        max_length=16,
        choices=CaptureKind.choices,
    )
    identifier = models.CharField(
        verbose_name="identifier",
        max_length=255,
        help_text="The snapshot's id, or the checkpoint's save id.",
    )
    step = models.BigIntegerField(
        verbose_name="step",
        null=True,
        blank=True,
    )
    bytes = models.PositiveBigIntegerField(
        verbose_name="size (bytes)",
        default=0,
    )
    paused_s = models.FloatField(
        verbose_name="training paused (s)",
        null=True,
        blank=True,
        help_text="How long training was blocked: a snapshot's hold, a checkpoint's staging stall.",
    )
    duration_s = models.FloatField(
        verbose_name="duration (s)",
        null=True,
        blank=True,
    )
    path = models.CharField(
        verbose_name="stored at",
        max_length=1024,
    )
    taken_at = models.DateTimeField(
        verbose_name="taken at",
    )
    undiscovered = models.JSONField(
        verbose_name="not captured",
        default=list,
        help_text="What the runtime could not discover, so is not in the snapshot.",
    )

    class Meta:
        ordering = ["-taken_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "kind", "identifier"], name="jobs_jobcapture_unique_job_kind_identifier"),
        ]


class WeightVersion(ClusterOwnedModel):
    """A version of a job's weights pushed to its rollout replicas, and who held which version."""

    tenant_parents = ("job",)

    job = models.ForeignKey(
        to=Job,
        on_delete=models.CASCADE,
        related_name="weight_versions",
        verbose_name="job",
    )
    publisher = models.CharField(
        verbose_name="publisher",
        max_length=64,
    )
    version = models.PositiveBigIntegerField(
        verbose_name="version",
    )
    bytes = models.PositiveBigIntegerField(
        verbose_name="bytes sent",
        default=0,
    )
    duration_s = models.FloatField(
        verbose_name="push duration (s)",
        null=True,
        blank=True,
    )
    replicas = models.JSONField(
        verbose_name="delivery",
        default=dict,
        help_text="Per replica: ok, or why it was lost.",
    )
    holders = models.JSONField(
        verbose_name="holders",
        default=dict,
        help_text="Per replica: the version received, applied and being sent when this one was delivered.",
    )
    pushed_at = models.DateTimeField(
        verbose_name="delivered at",
    )

    class Meta:
        ordering = ["-pushed_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "publisher", "version"], name="jobs_weightversion_unique_job_publisher_version"),
        ]


class PathEventKind(models.TextChoices):
    FAILOVER = "failover", "Failover"
    FAILBACK = "failback", "Failback"


class PathEvent(ClusterOwnedModel):
    """The NCCL plugin moved a communicator's traffic off a NIC (failover) or back (failback)."""

    tenant_parents = ("node",)

    node = models.ForeignKey(
        to="fleet.Node",
        on_delete=models.CASCADE,
        related_name="path_events",
        verbose_name="node",
    )
    kind = models.CharField(
        verbose_name="kind",
        max_length=16,
        choices=PathEventKind.choices,
    )
    comm = models.CharField(
        verbose_name="communicator",
        max_length=64,
        blank=True,
    )
    rank = models.IntegerField(
        verbose_name="rank",
        null=True,
        blank=True,
    )
    from_device = models.CharField(
        verbose_name="from",
        max_length=64,
        blank=True,
    )
    to_device = models.CharField(
        verbose_name="to",
        max_length=64,
        blank=True,
    )
    reason = models.CharField(
        verbose_name="reason",
        max_length=255,
        blank=True,
    )
    ts = models.DateTimeField(
        verbose_name="at",
    )

    class Meta:
        ordering = ["-ts", "-id"]
        indexes = [models.Index(fields=["node", "ts"], name="jobs_pathevent_node_ts")]
