from rest_framework import serializers

from console.fleet.models import Cluster
from console.incidents.models import Incident, IncidentEvent, ProbePlan, ProbeWindow


class IncidentEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = IncidentEvent
        fields = ["id", "ts", "kind", "confidence", "loss", "data"]
        read_only_fields = fields


class IncidentSerializer(serializers.ModelSerializer):
    acknowledged_by = serializers.CharField(source="acknowledged_by.username", read_only=True, allow_null=True, default=None)
    resolved_by = serializers.CharField(source="resolved_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Incident
        fields = ["id", "organization", "cluster", "kind", "culprit", "network_ok", "state", "confidence", "loss",
                  "first_seen", "last_seen", "opened_at", "acknowledged_at", "acknowledged_by", "resolved_at",
                  "resolved_by", "windows", "reopened"]
        read_only_fields = fields


class IncidentDetailSerializer(IncidentSerializer):
    timeline = serializers.SerializerMethodField()

    class Meta(IncidentSerializer.Meta):
        fields = [*IncidentSerializer.Meta.fields, "evidence", "timeline"]
        read_only_fields = fields

    def get_timeline(self, incident) -> list[dict]:
        return IncidentEventSerializer(incident.events.order_by("ts", "id"), many=True).data


class ProbeWindowSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProbeWindow
        fields = ["id", "organization", "cluster", "start_ns", "window_s", "expected", "reported", "state", "triangulated_at",
                  "network_ok", "verdict", "summary", "error"]
        read_only_fields = fields


class ProbePlanSerializer(serializers.ModelSerializer):
    class Meta:
        model = ProbePlan
        fields = ["id", "organization", "cluster", "revision", "pushed_at", "nics", "pairs", "nodes", "skipped",
                  "options"]
        read_only_fields = fields


class ProbePlanPushSerializer(serializers.Serializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    options = serializers.DictField(required=False, default=dict,
                                    help_text="Plan options: interval_ms, window_ms, port, sport_first, sport_count, "
                                              "deadline_floor_ms, paths.")
    force = serializers.BooleanField(required=False, default=False,
                                     help_text="Push even when the plan did not change.")
