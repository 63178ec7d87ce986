from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from api.filtersets import IncidentFilterSet, ProbePlanFilterSet, ProbeWindowFilterSet
from api.serializers.incidents import (
    IncidentDetailSerializer,
    IncidentSerializer,
    ProbePlanPushSerializer,
    ProbePlanSerializer,
    ProbeWindowSerializer,
)
from api.viewsets import ScopedReadOnlyViewSet, ScopedViewSetMixin
from console.incidents import services
from console.incidents.models import Incident, ProbePlan, ProbeWindow


class IncidentViewSet(ScopedReadOnlyViewSet):
    """Faults the probe mesh found: culprit, confidence, first/last seen, evidence and timeline;
    acknowledge or resolve one."""

    model = Incident
    filterset_class = IncidentFilterSet
    ordering_fields = ["last_seen", "first_seen", "confidence"]

    def get_serializer_class(self):
        return IncidentDetailSerializer if self.action != "list" else IncidentSerializer

    def scoped_queryset(self, queryset):
        return queryset.select_related("acknowledged_by", "resolved_by").order_by("-last_seen", "-id")

    @extend_schema(request=None, responses={200: IncidentDetailSerializer})
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None, format=None):
        incident = self.get_object()
        self.require_role(incident.organization_id)
        return Response(IncidentDetailSerializer(services.acknowledge(incident, request.user)).data)

    @extend_schema(request=None, responses={200: IncidentDetailSerializer})
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None, format=None):
        incident = self.get_object()
        self.require_role(incident.organization_id)
        return Response(IncidentDetailSerializer(services.resolve(incident, request.user)).data)


class ProbeWindowViewSet(ScopedReadOnlyViewSet):
    """A cluster's probe windows (newest first): how full, and what the triangulation said."""

    model = ProbeWindow
    serializer_class = ProbeWindowSerializer
    filterset_class = ProbeWindowFilterSet

    def scoped_queryset(self, queryset):
        return queryset.order_by("-start_ns", "-id")


class ProbePlanViewSet(ScopedViewSetMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                       mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The probe plan of each cluster; POST computes it from the topology and pushes it to the
    agents (re-pushed by itself when the topology or the ready nodes change)."""

    model = ProbePlan
    serializer_class = ProbePlanSerializer
    filterset_class = ProbePlanFilterSet

    def get_serializer_class(self):
        return ProbePlanPushSerializer if self.action == "create" else ProbePlanSerializer

    @extend_schema(request=ProbePlanPushSerializer, responses={201: ProbePlanSerializer})
    def create(self, request, *args, **kwargs):
        push = ProbePlanPushSerializer(data=request.data, context=self.get_serializer_context())
        push.is_valid(raise_exception=True)
        cluster = push.validated_data["cluster"]
        self.require_role(cluster.organization_id)
        plan = services.push_probe_plan(cluster, options=push.validated_data["options"],
                                        force=push.validated_data["force"], user=request.user)
        return Response(ProbePlanSerializer(plan).data, status=status.HTTP_201_CREATED)
