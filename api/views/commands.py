from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from api.filtersets import CommandFilterSet
from api.serializers.commands import CommandSerializer, CommandTypeSerializer
from api.viewsets import ScopedViewSetMixin
from console.commands import dispatch, registry
from console.commands.models import Command


class CommandViewSet(ScopedViewSetMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                     mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Commands for agents: queue one (idempotent with `idempotency_key`), follow its state, cancel it."""

    model = Command
    serializer_class = CommandSerializer
    filterset_class = CommandFilterSet
    ordering_fields = ["created", "state"]

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = serializer.validated_data["node"]
        self.require_role(node.organization_id)
        command, created = dispatch.issue_command(
            node, serializer.validated_data["type"], serializer.validated_data.get("args"),
            user=request.user, idempotency_key=serializer.validated_data.get("idempotency_key"),
        )
        return Response(self.get_serializer(command).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={200: CommandSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        command = self.get_object()
        self.require_role(command.organization_id)
        if not dispatch.cancel(command):
            raise exceptions.ValidationError({"state": f"a {command.state} command cannot be cancelled"})
        return Response(self.get_serializer(command).data)


class CommandTypeViewSet(viewsets.ViewSet):
    """The command types agents understand."""

    @extend_schema(responses={200: CommandTypeSerializer(many=True)})
    def list(self, request):
        types = [registry.get(name) for name in registry.names()]
        return Response(CommandTypeSerializer(types, many=True).data)
