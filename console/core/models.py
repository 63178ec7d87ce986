"""Abstract base models every Lockstep table builds on.

`TimestampedModel` → `OrganizationOwnedModel` (a non-null organization on every domain row)
→ `ClusterOwnedModel` (organization and cluster denormalized, so tenant and cluster filters
never need deep joins). Constraint names follow `%(app_label)s_%(class)s_<what>`.
"""

from __future__ import annotations

from django.db import models


class TimestampedModel(models.Model):
    created = models.DateTimeField(
        verbose_name="created",
        auto_now_add=True,
    )
    updated = models.DateTimeField(
        verbose_name="updated",
        auto_now=True,
    )

    class Meta:
        abstract = True


class OrganizationOwnedModel(TimestampedModel):
    """A row that belongs to exactly one organization (the tenant)."""

    organization = models.ForeignKey(
        to="tenancy.Organization",
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="organization",
    )

    class Meta:
        abstract = True


class ClusterOwnedModel(OrganizationOwnedModel):
    """A row inside one cluster. `organization` is copied from the cluster on save."""

    cluster = models.ForeignKey(
        to="fleet.Cluster",
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="cluster",
    )

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if self.cluster_id and not self.organization_id:
            self.organization_id = self.cluster.organization_id
        super().save(*args, **kwargs)


class Health(models.TextChoices):
    """Health of a fabric element as the live map colors it."""

    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    DOWN = "down", "Down"
    UNKNOWN = "unknown", "Unknown"
