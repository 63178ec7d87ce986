from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from api.filtersets import AuditRunFilterSet
from api.serializers.audits import (
    AuditRunDetailSerializer,
    AuditRunSerializer,
    AuditScheduleSerializer,
    AuditStartSerializer,
)
from api.viewsets import ScopedViewSetMixin
from console.audits import report, services
from console.audits.models import AuditRun, AuditSchedule
from console.core.errors import NotFound


class AuditRunViewSet(ScopedViewSetMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Audits of clusters: progress, per-node outcomes, findings with evidence, the verdict; cancel;
    the report as JSON and PDF. Start one with POST /clusters/{id}/audits/."""

    model = AuditRun
    filterset_class = AuditRunFilterSet
    ordering_fields = ["created", "state", "verdict"]

    def get_serializer_class(self):
        return AuditRunDetailSerializer if self.action == "retrieve" else AuditRunSerializer

    def scoped_queryset(self, queryset):
        return queryset.prefetch_related("nodes__node", "findings")

    @extend_schema(request=None, responses={200: AuditRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None, format=None):
        run = self.get_object()
        self.require_role(run.organization_id)
        services.cancel(run)
        return Response(AuditRunSerializer(self.get_queryset().get(pk=run.pk)).data)

    @extend_schema(responses={200: dict}, description="The report as JSON: the lockstep.audit.verdict/v1 "
                   "document with the fleet agreement and the loaded pairs (null until the audit finishes).")
    @action(detail=True, methods=["get"], filterset_class=None)
    def report(self, request, pk=None, format=None):
        run = self.get_object()
        return Response(report.document(run))

    @extend_schema(responses={(200, "application/pdf"): bytes}, description="The report as a PDF.")
    @action(detail=True, methods=["get"], filterset_class=None)
    def pdf(self, request, pk=None, format=None):
        run = self.get_object()
        response = HttpResponse(report.pdf(run), content_type="application/pdf")
        response["Content-Disposition"] = f'attachment; filename="audit-{run.pk}.pdf"'
        return response


def start_audit_response(view, request, cluster) -> Response:
    """POST /clusters/{id}/audits/: validate, check the role, start once."""
    serializer = AuditStartSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    view.require_role(cluster.organization_id)
    data = serializer.validated_data
    run, created = services.start_audit(cluster, node_ids=data.get("nodes"), options=data.get("options"),
                                        user=request.user, idempotency_key=data.get("idempotency_key"))
    run = AuditRun.objects.prefetch_related("nodes__node").get(pk=run.pk)
    return Response(AuditRunSerializer(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def schedule_response(view, request, cluster) -> Response:
    """GET/PUT /clusters/{id}/audit-schedule/."""
    if request.method == "GET":
        schedule = AuditSchedule.objects.filter(cluster=cluster).first()
        if schedule is None:
            raise NotFound("This cluster has no audit schedule; PUT one to create it.")
        return Response(AuditScheduleSerializer(schedule).data)
    view.require_role(cluster.organization_id)
    body = request.data if isinstance(request.data, dict) else {}
    schedule = services.set_schedule(cluster, interval_s=body.get("interval_s"), enabled=body.get("enabled", True),
                                     options=body.get("options"))
    return Response(AuditScheduleSerializer(schedule).data)
