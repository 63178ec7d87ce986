from __future__ import annotations

from datetime import timedelta

from django.db.models import Count
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from api.filtersets import (
    ClusterFilterSet,
    EnrollmentTokenFilterSet,
    GpuFilterSet,
    LinkFilterSet,
    NicFilterSet,
    NodeFilterSet,
    SwitchFilterSet,
)
from api.serializers.audits import AuditRunSerializer, AuditScheduleSerializer, AuditStartSerializer
from api.serializers.commands import CommandSerializer
from api.serializers.fleet import (
    ClusterSerializer,
    EnrollmentTokenCreatedSerializer,
    EnrollmentTokenSerializer,
    GpuSerializer,
    LinkSerializer,
    NicSerializer,
    NodeSerializer,
    PathsSerializer,
    SwitchSerializer,
    TopologySummarySerializer,
)
from api.views.audits import schedule_response, start_audit_response
from api.viewsets import ScopedModelViewSet, ScopedReadOnlyViewSet, ScopedViewSetMixin
from console.audits import services as audits
from console.audits.models import AuditRun
from console.commands import services as commands
from console.fleet import services
from console.fleet.install_command import install_command, install_command_token_file
from console.fleet.models import Cluster, EnrollmentToken, Gpu, Link, Nic, Node, Switch
from console.fleet.paths import ecmp_paths
from console.fleet.status import cluster_status
from console.tenancy.models import Role


class ClusterViewSet(ScopedModelViewSet):
    """Clusters, their topology (import/export), enrollment tokens and live status."""

    model = Cluster
    serializer_class = ClusterSerializer
    filterset_class = ClusterFilterSet
    ordering_fields = ["name", "created"]

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        rows = page if page is not None else list(queryset)
        counts = services.node_counts_by_state([c.pk for c in rows])
        for cluster in rows:
            cluster._node_counts = counts[cluster.pk]
        return page

    def perform_create(self, serializer):
        data = serializer.validated_data
        organization = data.get("organization")
        org_id = organization.pk if organization else self.scope.default_organization_id
        if org_id is None:
            raise exceptions.ValidationError({"organization": "you are not a member of any organization"})
        self.require_role(org_id)
        serializer.instance = services.create_cluster(org_id, data["name"], data.get("description", ""))

    def perform_update(self, serializer):
        self.require_role(serializer.instance.organization_id)
        data = serializer.validated_data
        services.update_cluster(serializer.instance, name=data.get("name"), description=data.get("description"))

    def perform_destroy(self, instance):
        self.require_role(instance.organization_id, Role.OWNER)
        services.delete_cluster(instance)

    @extend_schema(
        methods=["GET"], responses={200: dict},
        description="The cluster's declared fabric as a lockstep.topology/v1 document.",
    )
    @extend_schema(
        methods=["PUT"], request=dict, responses={200: TopologySummarySerializer},
        description="Replace the declared fabric with a lockstep.topology/v1 document. A document with any "
                    "problem is refused as a whole (400, every problem listed) and nothing changes.",
    )
    @action(detail=True, methods=["get", "put"])
    def topology(self, request, pk=None, format=None):
        cluster = self.get_object()
        if request.method == "GET":
            return Response(services.export_topology(cluster))
        return Response(services.import_topology(cluster, request.data).as_dict())

    @extend_schema(
        methods=["POST"], request=EnrollmentTokenSerializer, responses={201: EnrollmentTokenCreatedSerializer},
        description="Create an enrollment token for this cluster. The answer holds the token (shown once) and "
                    "the one-line install command.",
    )
    @extend_schema(methods=["GET"], responses={200: EnrollmentTokenSerializer(many=True)})
    @action(detail=True, methods=["get", "post"], url_path="enrollment-tokens", filterset_class=None)
    def enrollment_tokens(self, request, pk=None, format=None):
        cluster = self.get_object()
        if request.method == "GET":
            tokens = EnrollmentToken.objects.filter(cluster=cluster).order_by("-created")
            page = self.paginate_queryset(tokens)
            data = EnrollmentTokenSerializer(page, many=True).data
            return self.get_paginated_response(data)
        serializer = EnrollmentTokenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        minted = services.mint_enrollment_token(
            cluster, created_by=request.user, description=data.get("description", ""), expires=data.get("expires"),
            lifetime=timedelta(seconds=data["expires_in_s"]) if "expires_in_s" in data else None,
            max_uses=data.get("max_uses", services.ENROLLMENT_TOKEN_MAX_USES),
        )
        minted.token.token = minted.plaintext
        minted.token.install_command = install_command(request)
        minted.token.install_command_token_file = install_command_token_file(request)
        return Response(EnrollmentTokenCreatedSerializer(minted.token).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[
            OpenApiParameter("src", str, required=True, description="Source NIC name (e.g. node0000/nic0)."),
            OpenApiParameter("dst", str, required=True, description="Destination NIC name."),
            OpenApiParameter("limit", int, description="At most this many paths listed (default 64, max 1024)."),
        ],
        responses={200: PathsSerializer},
        description="The equal-cost shortest paths (ECMP) between two NICs, as lists of link ids.",
    )
    @action(detail=True, methods=["get"], filterset_class=None)
    def paths(self, request, pk=None, format=None):
        cluster = self.get_object()
        src, dst = request.query_params.get("src", ""), request.query_params.get("dst", "")
        try:
            limit = min(max(int(request.query_params.get("limit", 64)), 1), 1024)
        except ValueError:
            raise exceptions.ValidationError({"limit": "must be an integer"}) from None
        if not src or not dst:
            raise exceptions.ValidationError({"src" if not src else "dst": "required (a NIC name)"})
        return Response(ecmp_paths(cluster, src, dst, limit))

    @extend_schema(responses={200: dict}, description="Compact health of every element: the polling fallback "
                   "of the live map (same data the websocket pushes).")
    @action(detail=True, methods=["get"])
    def status(self, request, pk=None, format=None):
        return Response(cluster_status(self.get_object()))

    @extend_schema(
        methods=["POST"], request=AuditStartSerializer, responses={201: AuditRunSerializer, 200: AuditRunSerializer},
        description="Start an audit of the cluster (or of `nodes`): node checks, fleet agreement, every link "
                    "loaded at once. A repeated `idempotency_key` returns the first run (200); a second audit of "
                    "nodes an audit holds is refused (409).",
    )
    @extend_schema(methods=["GET"], responses={200: AuditRunSerializer(many=True)})
    @action(detail=True, methods=["get", "post"], filterset_class=None)
    def audits(self, request, pk=None, format=None):
        cluster = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(AuditRun.objects.filter(cluster=cluster).prefetch_related("nodes")
                                          .order_by("-created"))
            return self.get_paginated_response(AuditRunSerializer(page, many=True).data)
        return start_audit_response(self, request, cluster)

    @extend_schema(methods=["GET"], responses={200: AuditScheduleSerializer})
    @extend_schema(methods=["PUT"], request=AuditScheduleSerializer, responses={200: AuditScheduleSerializer},
                   description="Audit the cluster every `interval_s` seconds (at least 600).")
    @action(detail=True, methods=["get", "put"], url_path="audit-schedule", filterset_class=None)
    def audit_schedule(self, request, pk=None, format=None):
        return schedule_response(self, request, self.get_object())


class NodeViewSet(ScopedReadOnlyViewSet):
    """Nodes (hosts) and their agents. Drain, return to service, retire; send commands."""

    model = Node
    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet
    ordering_fields = ["name", "state", "last_seen", "position"]

    def scoped_queryset(self, queryset):
        return queryset.annotate(gpu_count=Count("gpus"))

    def _transition(self, request, fn):
        node = self.get_object()
        self.require_role(node.organization_id)
        fn(node)
        return Response(NodeSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None, format=None):
        return self._transition(request, services.drain)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None, format=None):
        return self._transition(request, services.undrain)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def retire(self, request, pk=None, format=None):
        return self._transition(request, services.retire)

    @extend_schema(request=AuditStartSerializer, responses={202: AuditRunSerializer},
                   description="Audit a draining node (`options` as for a cluster's audit); it returns to ready "
                               "only if it passes (undrain: at once, no audit).")
    @action(detail=True, methods=["post"], url_path="return-to-service")
    def return_to_service(self, request, pk=None, format=None):
        node = self.get_object()
        self.require_role(node.organization_id)
        options = request.data.get("options") if isinstance(request.data, dict) else None
        run = audits.return_to_service(node, user=request.user, options=options)
        return Response(AuditRunSerializer(AuditRun.objects.get(pk=run.pk)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: NodeSerializer},
                   description="Revoke the node's credential: its agent stops, and an enrollment token may "
                               "enroll the node again (a token alone never replaces an active credential).")
    @action(detail=True, methods=["post"], url_path="reset-credential")
    def reset_credential(self, request, pk=None, format=None):
        return self._transition(request, services.reset_credentials)

    @extend_schema(responses={200: dict}, description="The last lockstep.inventory/v1 document the agent sent.")
    @action(detail=True, methods=["get"])
    def inventory(self, request, pk=None, format=None):
        return Response(self.get_object().inventory or {})

    @extend_schema(
        methods=["POST"], request=CommandSerializer, responses={201: CommandSerializer},
        description="Queue a command for this node's agent (`node` may be omitted).",
    )
    @extend_schema(methods=["GET"], responses={200: CommandSerializer(many=True)})
    @action(detail=True, methods=["get", "post"], filterset_class=None)
    def commands(self, request, pk=None, format=None):
        node = self.get_object()
        if request.method == "GET":
            page = self.paginate_queryset(node.commands.order_by("-created"))
            return self.get_paginated_response(CommandSerializer(page, many=True).data)
        data = {**request.data, "node": node.pk} if isinstance(request.data, dict) else request.data
        return issue_command_response(self, request, data)


class GpuViewSet(ScopedReadOnlyViewSet):
    """GPUs as the agents report them."""

    model = Gpu
    serializer_class = GpuSerializer
    filterset_class = GpuFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("node", "nearest_nic")


class NicViewSet(ScopedReadOnlyViewSet):
    """NICs: declared by the topology, completed by the agents' inventory."""

    model = Nic
    serializer_class = NicSerializer
    filterset_class = NicFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("node")


class SwitchViewSet(ScopedReadOnlyViewSet):
    """Switches, declared by the topology."""

    model = Switch
    serializer_class = SwitchSerializer
    filterset_class = SwitchFilterSet


class LinkViewSet(ScopedReadOnlyViewSet):
    """Cables, declared by the topology; each end a NIC or a switch."""

    model = Link
    serializer_class = LinkSerializer
    filterset_class = LinkFilterSet

    def scoped_queryset(self, queryset):
        return queryset.select_related("a_nic", "a_switch", "b_nic", "b_switch")


class EnrollmentTokenViewSet(ScopedViewSetMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                             mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Enrollment tokens of your clusters (create them on the cluster). DELETE revokes."""

    model = EnrollmentToken
    serializer_class = EnrollmentTokenSerializer
    filterset_class = EnrollmentTokenFilterSet

    def destroy(self, request, *args, **kwargs):
        services.revoke_enrollment_token(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


def issue_command_response(view, request, data) -> Response:
    """POST /commands/ and POST /nodes/{id}/commands/: validate, check the role, issue once."""
    serializer = CommandSerializer(data=data, context=view.get_serializer_context())
    serializer.is_valid(raise_exception=True)
    node = serializer.validated_data["node"]
    view.require_role(node.organization_id)
    command, created = commands.issue_command(
        node, serializer.validated_data["type"], serializer.validated_data.get("args"),
        user=request.user, idempotency_key=serializer.validated_data.get("idempotency_key"),
    )
    return Response(CommandSerializer(command).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

