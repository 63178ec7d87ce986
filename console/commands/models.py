"""Commands the console asks an agent to run, and their results."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.core.models import ClusterOwnedModel

__all__ = ["Command", "CommandState"]


class CommandState(models.TextChoices):
    PENDING = "pending", "Pending"  # waiting for the node's next poll
    DELIVERED = "delivered", "Delivered"  # claimed by a poll; lease running
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"  # delivered max_attempts times without a result
    CANCELLED = "cancelled", "Cancelled"


OPEN_STATES = (CommandState.PENDING, CommandState.DELIVERED)
FINAL_STATES = (CommandState.SUCCEEDED, CommandState.FAILED, CommandState.EXPIRED, CommandState.CANCELLED)


class Command(ClusterOwnedModel):
    """One unit of work for one node's agent: delivered at least once, its result accepted once."""

    tenant_parents = ("node",)

    id = models.UUIDField(
        primary_key=True,
        default=uuid.uuid4,
        editable=False,
    )
    node = models.ForeignKey(
        to="fleet.Node",
        on_delete=models.CASCADE,
        related_name="commands",
        verbose_name="node",
    )
    type = models.CharField(
        verbose_name="type",
        max_length=64,
    )
    args = models.JSONField(
        verbose_name="arguments",
        default=dict,
        blank=True,
    )
    state = models.CharField(
        verbose_name="state",
        max_length=16,
        choices=CommandState.choices,
        default=CommandState.PENDING,
    )
    attempt = models.PositiveIntegerField(
        verbose_name="deliveries so far",
        default=0,
    )
    max_attempts = models.PositiveIntegerField(
        verbose_name="maximum deliveries",
        default=3,
    )
    timeout_s = models.PositiveIntegerField(
        verbose_name="timeout (s)",
        default=60,
    )
    idempotency_key = models.CharField(
        verbose_name="idempotency key",
        max_length=100,
        null=True,
        blank=True,
        help_text="A second request with the same key for the same node returns the first command.",
    )
    created_by = models.ForeignKey(
        to=settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        related_name="+",
        null=True,
        blank=True,
        verbose_name="created by",
    )
    delivered_at = models.DateTimeField(
        verbose_name="last delivered at",
        null=True,
        blank=True,
    )
    lease_expires = models.DateTimeField(
        verbose_name="lease expires",
        null=True,
        blank=True,
    )
    completed_at = models.DateTimeField(
        verbose_name="completed at",
        null=True,
        blank=True,
    )
    result = models.JSONField(
        verbose_name="result",
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
                fields=["node", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="commands_command_unique_node_idempotency_key",
            ),
        ]
        indexes = [
            # The poll's claim query: this node's pending commands, oldest first.
            models.Index(
                fields=["node", "created"],
                condition=Q(state="pending"),
                name="commands_command_pending",
            ),
            # The lease sweep: delivered commands by lease end.
            models.Index(
                fields=["lease_expires"],
                condition=Q(state="delivered"),
                name="commands_command_leased",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} on {self.node_id} ({self.state})"
