from __future__ import annotations

from rest_framework import serializers

from console.clocks.models import ClockSync, NodeClock, PairEstimate
from console.fleet.models import Cluster


class ClockSyncSerializer(serializers.ModelSerializer):
    # Resolved in the caller's tenant scope: another tenant's cluster is "does not exist".
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    peers = serializers.IntegerField(min_value=2, max_value=16, default=4)
    rate_hz = serializers.FloatField(min_value=1.0, max_value=2000.0, default=200.0)
    window_s = serializers.FloatField(min_value=0.5, max_value=30.0, default=2.0)
    reference_name = serializers.CharField(source="reference.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ClockSync
        fields = ["id", "organization", "cluster", "running", "peers", "rate_hz", "window_s", "reference",
                  "reference_name", "planned", "nodes_total", "nodes_synced", "worst_bound_ns", "solved_at",
                  "flagged", "disconnected", "noise_scale", "created"]
        read_only_fields = ["id", "organization", "running", "reference", "reference_name", "planned", "nodes_total",
                            "nodes_synced", "worst_bound_ns", "solved_at", "flagged", "disconnected", "noise_scale",
                            "created"]
        validators = []  # starting it again re-plans (console.clocks.services.start)


class NodeClockSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = NodeClock
        fields = ["id", "organization", "cluster", "node", "node_name", "state", "offset_ns", "drift_ppm", "sigma_ns",
                  "jitter_ns", "bound_ns", "solved_at", "corrected_at", "steps", "last_step_ns", "last_step_at", "history"]
        read_only_fields = fields


class PairEstimateSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    peer_name = serializers.CharField(source="peer.name", read_only=True)

    class Meta:
        model = PairEstimate
        fields = ["id", "organization", "cluster", "node", "node_name", "peer", "peer_name", "offset_ns", "drift_ppm",
                  "sigma_ns", "min_owd_ns", "probes_used", "timestamping", "measured_at", "residual_ns", "flagged"]
        read_only_fields = fields
