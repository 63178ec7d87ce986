from rest_framework import serializers

from api.serializers.base import StrictModelSerializer
from console.telemetry.models import TelemetryRecord


class TelemetryRecordSerializer(StrictModelSerializer):
    seq = serializers.IntegerField(source="batch.seq", read_only=True)

    class Meta:
        model = TelemetryRecord
        fields = ["id", "organization", "cluster", "node", "seq", "kind", "ts", "data"]
        read_only_fields = fields
