from __future__ import annotations

from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from api.filtersets import ClockSyncFilterSet, NodeClockFilterSet, PairEstimateFilterSet
from api.serializers.clocks import ClockSyncSerializer, NodeClockSerializer, PairEstimateSerializer
from api.viewsets import ScopedReadOnlyViewSet, ScopedViewSetMixin
from console.clocks import services
from console.clocks.models import ClockSync, NodeClock, PairEstimate


class ClockSyncViewSet(ScopedViewSetMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                       mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Clock sync per cluster: POST starts it (or re-plans it), the row says how well the cluster is
    synchronized (worst bound, nodes synced, flagged pairs, islands), DELETE stops it."""

    model = ClockSync
    serializer_class = ClockSyncSerializer
    filterset_class = ClockSyncFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("reference")

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        self.require_role(data["cluster"].organization_id)
        sync = services.start(data["cluster"], peers=data["peers"], rate_hz=data["rate_hz"],
                              window_s=data["window_s"])
        return Response(self.get_serializer(sync).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        sync = self.get_object()
        self.require_role(sync.organization_id)
        services.stop(sync)
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodeClockViewSet(ScopedReadOnlyViewSet):
    """Each node's clock against its cluster's reference: offset, drift, bound, state, steps detected."""

    model = NodeClock
    serializer_class = NodeClockSerializer
    filterset_class = NodeClockFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("node")


class PairEstimateViewSet(ScopedReadOnlyViewSet):
    """The newest estimate of each probed pair, with its residual in the last network solve."""

    model = PairEstimate
    serializer_class = PairEstimateSerializer
    filterset_class = PairEstimateFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("node", "peer")
