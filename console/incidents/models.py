"""Incidents: what the probe mesh's windows, triangulated, say is wrong with a cluster's fabric.

- `ProbeWindow`: one window of a cluster (every NIC's `probe.window` records of one start time)
  as it fills, is triangulated, and what the verdict said; kept for `PROBE_WINDOW_RETENTION_S`.
- `ProbeReport`: one NIC's record of a window (the stored telemetry record holding it), filed
  with its batch: a window's records are read by its key, not searched for.
- `Incident`: one fault, from open to resolved, with its culprit (a link, switch, NIC or host),
  confidence, first/last seen and evidence (the affected pairs, before and during).
- `IncidentEvent`: an incident's timeline: state changes and one point per window it was seen.
- `IncidentTracker`: a cluster's hysteresis state between windows (workers.incidents).
- `ProbePlan`: the probe plan last pushed to a cluster's agents, and what it was computed from.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from console.core.models import ClusterOwnedModel

__all__ = ["CulpritKind", "Incident", "IncidentEvent", "IncidentState", "IncidentTracker", "ProbePlan", "ProbeReport",
           "ProbeWindow", "WindowState"]


class WindowState(models.TextChoices):
    FILLING = "filling", "Filling"  # records still arriving
    QUEUED = "queued", "Queued"  # complete (or overdue): handed to the triangulation task
    DONE = "done", "Triangulated"
    LATE = "late", "Late"  # triangulated after a newer window: stored, not tracked
    SETTLING = "settling", "Settling"  # started while agents were taking up a new plan: stored, not tracked
    FAILED = "failed", "Failed"  # the window could not be triangulated (its error says why)


class ProbeWindow(ClusterOwnedModel):
    start_ns = models.BigIntegerField(verbose_name="window start (ns)")
    window_s = models.FloatField(verbose_name="window length (s)")
    expected = models.PositiveIntegerField(verbose_name="NICs expected to report", default=0)
    reported = models.PositiveIntegerField(verbose_name="NIC records received", default=0)
    state = models.CharField(verbose_name="state", max_length=16, choices=WindowState.choices,
                             default=WindowState.FILLING)
    triangulated_at = models.DateTimeField(verbose_name="triangulated at", null=True, blank=True)
    network_ok = models.BooleanField(verbose_name="network ok", null=True, blank=True)
    verdict = models.JSONField(verbose_name="verdict", default=dict, blank=True,
                               help_text="The lockstep.verdict/v1 of the window.")
    summary = models.JSONField(verbose_name="summary", default=dict, blank=True,
                               help_text="Pairs, probes, loss, and the lossiest pairs (bounded).")
    error = models.CharField(verbose_name="error", max_length=1000, blank=True)

    class Meta:
        ordering = ["cluster", "-start_ns"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "start_ns"], name="incidents_probewindow_unique_cluster_start"),
            models.UniqueConstraint(fields=["id", "cluster", "organization"],
                                    name="incidents_probewindow_unique_id_placement"),
        ]
        indexes = [models.Index(fields=["cluster", "state", "start_ns"], name="incidents_window_cluster_state")]


class ProbeReport(ClusterOwnedModel):
    """One NIC's `probe.window` record of a window: the telemetry record that holds it (its data
    is stored once, there), filed in the batch's transaction. Deleted with its window."""

    tenant_parents = ("window",)

    window = models.ForeignKey(to=ProbeWindow, on_delete=models.CASCADE, related_name="reports",
                               verbose_name="window")
    record = models.ForeignKey(to="telemetry.TelemetryRecord", on_delete=models.CASCADE, related_name="+",
                               verbose_name="telemetry record")
    nic = models.CharField(verbose_name="NIC", max_length=255)

    class Meta:
        ordering = ["window", "id"]


class IncidentState(models.TextChoices):
    OPEN = "open", "Open"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"  # an operator is on it; still open
    RESOLVED = "resolved", "Resolved"


class CulpritKind(models.TextChoices):
    LINK = "link", "Link"
    SWITCH = "switch", "Switch"
    NIC = "nic", "NIC"
    HOST = "host", "Host"


class Incident(ClusterOwnedModel):
    kind = models.CharField(verbose_name="culprit kind", max_length=16, choices=CulpritKind.choices)
    culprit = models.CharField(verbose_name="culprit", max_length=255,
                               help_text="The element's name: a link id, a switch, a NIC or a host.")
    network_ok = models.BooleanField(verbose_name="network ok", default=False,
                                     help_text="True for a host culprit: the network is not to blame.")
    state = models.CharField(verbose_name="state", max_length=16, choices=IncidentState.choices,
                             default=IncidentState.OPEN)
    confidence = models.FloatField(verbose_name="confidence", default=0.0)
    loss = models.FloatField(verbose_name="loss rate", null=True, blank=True,
                             help_text="The culprit's estimated loss rate in the last window naming it.")
    first_seen = models.DateTimeField(verbose_name="first seen")
    last_seen = models.DateTimeField(verbose_name="last seen")
    opened_at = models.DateTimeField(verbose_name="opened at", auto_now_add=True)
    resolved_at = models.DateTimeField(verbose_name="resolved at", null=True, blank=True)
    resolved_by = models.ForeignKey(to=settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+",
                                    null=True, blank=True, verbose_name="resolved by")
    acknowledged_at = models.DateTimeField(verbose_name="acknowledged at", null=True, blank=True)
    acknowledged_by = models.ForeignKey(to=settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, related_name="+",
                                        null=True, blank=True, verbose_name="acknowledged by")
    windows = models.PositiveIntegerField(verbose_name="windows naming it", default=0)
    reopened = models.PositiveIntegerField(verbose_name="times reopened", default=0)
    evidence = models.JSONField(verbose_name="evidence", default=dict, blank=True,
                                help_text="The affected pairs (src, dst, loss, delay) before and during.")

    class Meta:
        ordering = ["-last_seen"]
        constraints = [
            models.UniqueConstraint(fields=["id", "cluster", "organization"],
                                    name="incidents_incident_unique_id_placement"),
        ]
        indexes = [
            models.Index(fields=["cluster", "state"], name="incidents_incident_cluster_st"),
            models.Index(fields=["cluster", "kind", "culprit"], name="incidents_incident_culprit"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.culprit}"

    @property
    def is_open(self) -> bool:
        return self.state != IncidentState.RESOLVED


class IncidentEvent(ClusterOwnedModel):
    tenant_parents = ("incident",)

    incident = models.ForeignKey(to=Incident, on_delete=models.CASCADE, related_name="events",
                                 verbose_name="incident")
    ts = models.DateTimeField(verbose_name="at")
    kind = models.CharField(verbose_name="kind", max_length=16,
                            help_text="opened, reopened, window, acknowledged, resolved")
    confidence = models.FloatField(verbose_name="confidence", null=True, blank=True)
    loss = models.FloatField(verbose_name="loss rate", null=True, blank=True)
    data = models.JSONField(verbose_name="data", default=dict, blank=True)

    class Meta:
        ordering = ["incident", "ts", "id"]


class IncidentTracker(ClusterOwnedModel):
    """One per cluster: the hysteresis state (workers.incidents.tracker) and the newest window
    tracked (older ones arriving late are triangulated but not tracked)."""

    state = models.JSONField(verbose_name="state", default=dict, blank=True)
    last_start_ns = models.BigIntegerField(verbose_name="newest window tracked (ns)", default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster"], name="incidents_tracker_unique_cluster")]


class ProbePlan(ClusterOwnedModel):
    """The probe plan last pushed to a cluster's agents."""

    fingerprint = models.CharField(verbose_name="fingerprint", max_length=64,
                                   help_text="Of the topology and members it was computed from.")
    revision = models.BigIntegerField(verbose_name="revision", default=0)
    pushed_at = models.DateTimeField(verbose_name="pushed at", null=True, blank=True)
    nics = models.PositiveIntegerField(verbose_name="NICs probing", default=0)
    pairs = models.PositiveIntegerField(verbose_name="pairs probed", default=0)
    nodes = models.PositiveIntegerField(verbose_name="agents told", default=0)
    skipped = models.JSONField(verbose_name="skipped", default=list, blank=True,
                               help_text="NICs left out, and why (no address known, node not ready).")
    options = models.JSONField(verbose_name="options", default=dict, blank=True,
                               help_text="Plan options (interval_ms, window_ms, ...) every push uses.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster"], name="incidents_probeplan_unique_cluster")]
