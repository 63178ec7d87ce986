"""Telemetry posted by agents: batches (deduplicated by node and sequence number) of records."""

from __future__ import annotations

from django.db import models

from console.core.models import ClusterOwnedModel

__all__ = ["TelemetryBatch", "TelemetryRecord"]


class TelemetryBatch(ClusterOwnedModel):
    """One accepted POST of telemetry; its (node, seq) makes agent retries harmless."""

    tenant_parents = ("node",)

    node = models.ForeignKey(
        to="fleet.Node",
        on_delete=models.CASCADE,
        related_name="telemetry_batches",
        verbose_name="node",
    )
    seq = models.BigIntegerField(
        verbose_name="sequence number",
    )
    record_count = models.PositiveIntegerField(
        verbose_name="records",
    )
    dropped = models.PositiveBigIntegerField(
        verbose_name="records the agent dropped before this batch",
        default=0,
    )

    class Meta:
        ordering = ["node", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["node", "seq"], name="telemetry_telemetrybatch_unique_node_seq"),
            models.UniqueConstraint(fields=["id", "node", "cluster", "organization"],
                                    name="telemetry_telemetrybatch_unique_id_placement"),
        ]


class TelemetryRecord(ClusterOwnedModel):
    """One aggregated measurement (a probe window, a health summary), not one raw sample."""

    tenant_parents = ("batch", "node")

    node = models.ForeignKey(
        to="fleet.Node",
        on_delete=models.CASCADE,
        related_name="telemetry_records",
        verbose_name="node",
    )
    batch = models.ForeignKey(
        to=TelemetryBatch,
        on_delete=models.CASCADE,
        related_name="records",
        verbose_name="batch",
    )
    kind = models.CharField(
        verbose_name="kind",
        max_length=64,
    )
    ts = models.DateTimeField(
        verbose_name="measured at",
    )
    data = models.JSONField(
        verbose_name="data",
        default=dict,
    )

    class Meta:
        ordering = ["-ts"]
        indexes = [
            models.Index(fields=["node", "kind", "ts"], name="telemetry_rec_node_kind_ts"),
            models.Index(fields=["cluster", "kind", "ts"], name="telemetry_rec_cluster_kind_ts"),
        ]
