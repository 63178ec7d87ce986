from api.filtersets import TelemetryRecordFilterSet
from api.serializers.telemetry import TelemetryRecordSerializer
from api.viewsets import ScopedReadOnlyViewSet
from console.telemetry.models import TelemetryRecord


class TelemetryRecordViewSet(ScopedReadOnlyViewSet):
    """Telemetry records posted by agents (newest first)."""

    model = TelemetryRecord
    serializer_class = TelemetryRecordSerializer
    filterset_class = TelemetryRecordFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("batch").order_by("-ts", "-id")
