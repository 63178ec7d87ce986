"""Clock sync of a cluster: whether it runs, each node's clock against the reference, each pair's estimate.

Written only by ``console.clocks.services``.
"""

from __future__ import annotations

from django.db import models

from console.core.models import ClusterOwnedModel

__all__ = ["ClockState", "ClockSync", "NodeClock", "PairEstimate"]


class ClockSync(ClusterOwnedModel):
    """Clock sync in one cluster: its plan, and the quality of the latest network solve."""

    running = models.BooleanField(verbose_name="running", default=True)
    peers = models.PositiveSmallIntegerField(verbose_name="peers per node", default=4)
    rate_hz = models.FloatField(verbose_name="coded probes per second per peer", default=200.0)
    window_s = models.FloatField(verbose_name="estimation window (s)", default=2.0)
    reference = models.ForeignKey(
        to="fleet.Node", on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
        verbose_name="reference node", help_text="The clock every other is synchronized to.",
    )
    planned = models.JSONField(verbose_name="planned nodes", default=list, blank=True)
    solved_at = models.DateTimeField(verbose_name="solved at", null=True, blank=True)
    worst_bound_ns = models.FloatField(verbose_name="worst bound (ns)", null=True, blank=True,
                                       help_text="The largest bound of a synced node's offset (3 σ).")
    nodes_synced = models.PositiveIntegerField(verbose_name="nodes synced", default=0)
    nodes_total = models.PositiveIntegerField(verbose_name="nodes planned", default=0)
    flagged = models.JSONField(verbose_name="flagged pairs", default=list, blank=True,
                               help_text="Pairs whose estimate the loops contradict: {a, b, residual_ns, z}.")
    disconnected = models.JSONField(verbose_name="cut off from the reference", default=list, blank=True)
    noise_scale = models.FloatField(verbose_name="noise scale", null=True, blank=True)

    class Meta:
        ordering = ["cluster"]
        constraints = [models.UniqueConstraint(fields=["cluster"], name="clocks_clocksync_unique_cluster")]


class ClockState(models.TextChoices):
    REFERENCE = "reference", "Reference"
    SYNCED = "synced", "Synced"
    UNSYNCED = "unsynced", "Not synced yet"
    ISLAND = "island", "Cut off from the reference"
    STALE = "stale", "No recent estimate"


class NodeClock(ClusterOwnedModel):
    """One node's clock against the reference, as the latest solve found it."""

    HISTORY_MAX = 300  # [unix s, offset ns, bound ns] points kept for the plot

    tenant_parents = ("node",)

    node = models.ForeignKey(to="fleet.Node", on_delete=models.CASCADE, related_name="+", verbose_name="node")
    state = models.CharField(verbose_name="state", max_length=16, choices=ClockState.choices,
                             default=ClockState.UNSYNCED)
    offset_ns = models.FloatField(verbose_name="offset (ns)", null=True, blank=True,
                                  help_text="This node's clock minus the reference's, at solved_at.")
    drift_ppm = models.FloatField(verbose_name="drift (ppm)", null=True, blank=True)
    sigma_ns = models.FloatField(verbose_name="uncertainty σ (ns)", null=True, blank=True)
    jitter_ns = models.FloatField(verbose_name="solve-to-solve jitter (ns)", null=True, blank=True,
                                  help_text="RMS of how far each solve lands from what the node serves.")
    bound_ns = models.FloatField(verbose_name="bound (ns)", null=True, blank=True,
                                 help_text="3 × √(σ² + jitter²): the cluster time this node serves is within this "
                                           "of the reference's clock.")
    t_local_ns = models.BigIntegerField(verbose_name="solve instant on the node's clock", null=True, blank=True)
    solved_at = models.DateTimeField(verbose_name="solved at", null=True, blank=True)
    corrected_at = models.DateTimeField(verbose_name="correction sent at", null=True, blank=True)
    correction = models.JSONField(verbose_name="correction sent", null=True, blank=True,
                                  help_text="The last correction sent to the node (what it serves, extrapolated).")
    steps = models.PositiveIntegerField(verbose_name="clock steps detected", default=0)
    last_step_ns = models.FloatField(verbose_name="last step (ns)", null=True, blank=True)
    last_step_at = models.DateTimeField(verbose_name="last step at", null=True, blank=True)
    history = models.JSONField(verbose_name="history", default=list, blank=True)

    class Meta:
        ordering = ["cluster", "node"]
        constraints = [models.UniqueConstraint(fields=["node"], name="clocks_nodeclock_unique_node")]


class PairEstimate(ClusterOwnedModel):
    """The newest estimate of one probed pair: ``peer``'s clock − ``node``'s, by ``node``."""

    tenant_parents = ("node", "peer")

    node = models.ForeignKey(to="fleet.Node", on_delete=models.CASCADE, related_name="+",
                             verbose_name="estimating node")
    peer = models.ForeignKey(to="fleet.Node", on_delete=models.CASCADE, related_name="+", verbose_name="peer")
    offset_ns = models.FloatField(verbose_name="offset (ns)")
    drift_ppm = models.FloatField(verbose_name="drift (ppm)")
    sigma_ns = models.FloatField(verbose_name="σ (ns)")
    min_owd_ns = models.FloatField(verbose_name="minimum one-way delay (ns)", null=True, blank=True)
    probes_used = models.PositiveIntegerField(verbose_name="probes used", default=0)
    t_ref_ns = models.BigIntegerField(verbose_name="estimate instant on the node's clock")
    timestamping = models.CharField(verbose_name="timestamping", max_length=16, blank=True)
    measured_at = models.DateTimeField(verbose_name="measured at")
    residual_ns = models.FloatField(verbose_name="residual in the last solve (ns)", null=True, blank=True)
    flagged = models.BooleanField(verbose_name="flagged by the loops", default=False)

    class Meta:
        ordering = ["cluster", "node", "peer"]
        constraints = [models.UniqueConstraint(fields=["node", "peer"], name="clocks_pairestimate_unique_pair")]
