"""Audits: a run over a cluster's nodes (or some of them), its per-node results and its findings.

A run moves through phases (``nodes``: every node's checks and the fleet agreement; ``load``:
every link loaded at once, localized by the triangulation; then the verdict) driven by the
audits' Celery tasks (``console.audits.tasks``), each step one call of ``services.advance``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.core.models import ClusterOwnedModel

__all__ = ["AuditFinding", "AuditNode", "AuditRun", "AuditSchedule", "NodeOutcome", "Phase", "RunState",
           "Trigger", "Verdict"]


class RunState(models.TextChoices):
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    CANCELLED = "cancelled", "Cancelled"


class Phase(models.TextChoices):
    NODES = "nodes", "Node checks"
    LOAD = "load", "Fabric under load"
    COLLECTIVE = "collective", "Collective bandwidth"
    DONE = "done", "Done"


class Verdict(models.TextChoices):
    PASS = "pass", "Pass"
    WARN = "warn", "Pass with warnings"
    FAIL = "fail", "Fail"


class Trigger(models.TextChoices):
    MANUAL = "manual", "Started by a person or the API"
    SCHEDULED = "scheduled", "Periodic"
    MAINTENANCE = "maintenance", "Return from maintenance"


class NodeOutcome(models.TextChoices):
    PENDING = "pending", "Pending"
    PASSED = "passed", "Passed"
    WARN = "warn", "Passed with warnings"
    FAILED = "failed", "Failed"
    NOT_AUDITED = "not_audited", "Not audited"


class AuditRun(ClusterOwnedModel):
    """One audit of a cluster, or of a set of its nodes."""

    state = models.CharField(
        verbose_name="state",
        max_length=16,
        choices=RunState.choices,
        default=RunState.RUNNING,
    )
    phase = models.CharField(
        verbose_name="phase",
        max_length=16,
        choices=Phase.choices,
        default=Phase.NODES,
    )
    phase_deadline = models.DateTimeField(
        verbose_name="phase deadline",
        null=True,
        blank=True,
        help_text="Commands of the phase still open then are cancelled, their nodes failed with the reason.",
    )
    trigger = models.CharField(
        verbose_name="trigger",
        max_length=16,
        choices=Trigger.choices,
        default=Trigger.MANUAL,
    )
    options = models.JSONField(
        verbose_name="options",
        default=dict,
        blank=True,
    )
    plan = models.JSONField(
        verbose_name="plan",
        default=dict,
        blank=True,
        help_text="What the run does: its phases, the node checks' arguments, the traffic plan's size.",
    )
    verdict = models.CharField(
        verbose_name="verdict",
        max_length=8,
        choices=Verdict.choices,
        blank=True,
    )
    report = models.JSONField(
        verbose_name="report",
        null=True,
        blank=True,
        help_text="The lockstep.audit.verdict/v1 document, with the fleet agreement and the loaded pairs.",
    )
    idempotency_key = models.CharField(
        verbose_name="idempotency key",
        max_length=100,
        null=True,
        blank=True,
        help_text="A second start with the same key for the same cluster returns the first run.",
    )
    created_by = models.ForeignKey(
        to=settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        related_name="+",
        null=True,
        blank=True,
        verbose_name="created by",
    )
    finished_at = models.DateTimeField(
        verbose_name="finished at",
        null=True,
        blank=True,
    )
    error = models.TextField(
        verbose_name="error",
        blank=True,
    )

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="audits_auditrun_unique_cluster_idempotency_key",
            ),
            # What children's composite foreign keys reference.
            models.UniqueConstraint(fields=["id", "cluster", "organization"], name="audits_auditrun_unique_id_placement"),
        ]
        indexes = [models.Index(fields=["state"], condition=Q(state="running"), name="audits_auditrun_running")]

    def __str__(self) -> str:
        return f"audit {self.pk} of {self.cluster_id} ({self.state})"


class AuditNode(ClusterOwnedModel):
    """One node of a run: its outcome, the command that checked it and its report."""

    tenant_parents = ("node", "run")

    run = models.ForeignKey(
        to=AuditRun,
        on_delete=models.CASCADE,
        related_name="nodes",
        verbose_name="run",
    )
    node = models.ForeignKey(
        to="fleet.Node",
        on_delete=models.CASCADE,
        related_name="audits",
        verbose_name="node",
    )
    outcome = models.CharField(
        verbose_name="outcome",
        max_length=16,
        choices=NodeOutcome.choices,
        default=NodeOutcome.PENDING,
    )
    reason = models.CharField(
        verbose_name="reason",
        max_length=500,
        blank=True,
    )
    check_command = models.ForeignKey(
        to="commands.Command",
        on_delete=models.SET_NULL,
        related_name="+",
        null=True,
        blank=True,
        verbose_name="node check command",
    )
    load_command = models.ForeignKey(
        to="commands.Command",
        on_delete=models.SET_NULL,
        related_name="+",
        null=True,
        blank=True,
        verbose_name="load command",
    )
    report = models.JSONField(
        verbose_name="report",
        null=True,
        blank=True,
        help_text="The node's lockstep.audit.node/v1 report.",
    )

    class Meta:
        ordering = ["run", "node__name"]
        constraints = [
            models.UniqueConstraint(fields=["run", "node"], name="audits_auditnode_unique_run_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id} in audit {self.run_id} ({self.outcome})"


class AuditFinding(ClusterOwnedModel):
    """A failed or warning check of a run, naming its element (a host, a GPU, a NIC, a link, a
    switch, or the fleet) and why: the code, the message, the numbers and the limits."""

    tenant_parents = ("run",)

    run = models.ForeignKey(
        to=AuditRun,
        on_delete=models.CASCADE,
        related_name="findings",
        verbose_name="run",
    )
    phase = models.CharField(
        verbose_name="phase",
        max_length=16,
        choices=Phase.choices,
    )
    element_kind = models.CharField(
        verbose_name="element kind",
        max_length=16,
    )
    element = models.CharField(
        verbose_name="element",
        max_length=255,
    )
    check_name = models.CharField(
        verbose_name="check",
        max_length=64,
    )
    status = models.CharField(
        verbose_name="status",
        max_length=8,
        choices=[("fail", "Fail"), ("warn", "Warning")],
    )
    culprit = models.BooleanField(
        verbose_name="culprit",
        default=False,
        help_text="The element is named as a culprit of the run.",
    )
    code = models.CharField(
        verbose_name="failure code",
        max_length=64,
        blank=True,
    )
    severity = models.CharField(
        verbose_name="severity",
        max_length=16,
        blank=True,
    )
    message = models.TextField(
        verbose_name="message",
    )
    action = models.TextField(
        verbose_name="recommended action",
        blank=True,
    )
    evidence = models.JSONField(
        verbose_name="evidence",
        default=dict,
        blank=True,
    )
    threshold = models.JSONField(
        verbose_name="threshold",
        default=dict,
        blank=True,
    )

    class Meta:
        ordering = ["run", "id"]

    def __str__(self) -> str:
        return f"{self.element_kind} {self.element}: {self.check_name} {self.status}"


class AuditSchedule(ClusterOwnedModel):
    """A periodic audit of a cluster (at most one per cluster)."""

    interval_s = models.PositiveIntegerField(
        verbose_name="interval (s)",
        help_text="Start an audit this long after the last one started (at least 600).",
    )
    enabled = models.BooleanField(
        verbose_name="enabled",
        default=True,
    )
    options = models.JSONField(
        verbose_name="options",
        default=dict,
        blank=True,
    )
    last_run = models.ForeignKey(
        to=AuditRun,
        on_delete=models.SET_NULL,
        related_name="+",
        null=True,
        blank=True,
        verbose_name="last run",
    )
    next_at = models.DateTimeField(
        verbose_name="next audit at",
    )

    class Meta:
        ordering = ["cluster"]
        constraints = [models.UniqueConstraint(fields=["cluster"], name="audits_auditschedule_unique_cluster")]

    def __str__(self) -> str:
        return f"every {self.interval_s}s on {self.cluster_id}"
