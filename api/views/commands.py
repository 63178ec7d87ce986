from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from api.filtersets import CommandFilterSet
from api.serializers.commands import CommandSerializer, CommandTypeSerializer
from api.views.fleet import issue_command_response
from api.viewsets import ScopedViewSetMixin
from console.commands import registry, services
from console.commands.models import Command


class CommandViewSet(ScopedViewSetMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                     mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Commands for agents: queue one (idempotent with `idempotency_key`), follow its state, cancel it."""

    model = Command
    serializer_class = CommandSerializer
    filterset_class = CommandFilterSet
    ordering_fields = ["created", "state"]

    def create(self, request, *args, **kwargs):
        return issue_command_response(self, request, request.data)

    @extend_schema(request=None, responses={200: CommandSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None, format=None):
        command = self.get_object()
        self.require_role(command.organization_id)
        return Response(self.get_serializer(services.cancel(command)).data)


class CommandTypeViewSet(viewsets.ViewSet):
    """The command types agents understand."""

    @extend_schema(responses={200: CommandTypeSerializer(many=True)})
    def list(self, request):
        types = [registry.get(name) for name in registry.names()]
        return Response(CommandTypeSerializer(types, many=True).data)
