from __future__ import annotations

from django.db import transaction
from django.db.models import Q
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.response import Response

from api.filtersets import ApiTokenFilterSet, MembershipFilterSet
from api.serializers.tenancy import (
    ApiTokenCreatedSerializer,
    ApiTokenSerializer,
    MembershipSerializer,
    OrganizationSerializer,
)
from api.viewsets import ScopedModelViewSet, ScopedViewSetMixin
from console.tenancy.models import ApiToken, Membership, Organization, Role


class OrganizationViewSet(ScopedModelViewSet):
    """Your organizations. Any signed-in user may create one and becomes its owner."""

    model = Organization
    scope_field = "id"
    serializer_class = OrganizationSerializer
    write_role = Role.OWNER
    http_method_names = ["get", "post", "patch", "head", "options"]

    def perform_create(self, serializer):
        if self.request.auth is not None:
            raise exceptions.PermissionDenied("API tokens belong to one organization; create organizations signed in.")
        with transaction.atomic():
            organization = serializer.save()
            Membership.objects.create(organization=organization, user=self.request.user, role=Role.OWNER)
        self.request._lockstep_scope = None  # the new membership widens this request's scope


class MembershipViewSet(ScopedModelViewSet):
    """Members of your organizations and their roles. Owners add, change and remove members."""

    model = Membership
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilterSet
    write_role = Role.OWNER
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def scoped_queryset(self, queryset):
        return queryset.select_related("user")

    def perform_update(self, serializer):
        with transaction.atomic():
            _keep_an_owner(serializer.instance, new_role=serializer.validated_data.get("role"))
            super().perform_update(serializer)

    def perform_destroy(self, instance):
        with transaction.atomic():
            _keep_an_owner(instance, new_role=None)
            instance.delete()


def _keep_an_owner(membership: Membership, new_role) -> None:
    if membership.role != Role.OWNER or new_role == Role.OWNER:
        return
    others = Membership.objects.select_for_update().filter(organization_id=membership.organization_id, role=Role.OWNER)
    if not others.exclude(pk=membership.pk).exists():
        raise exceptions.ValidationError({"role": "an organization needs at least one owner"})


class ApiTokenViewSet(ScopedViewSetMixin, mixins.CreateModelMixin, mixins.ListModelMixin,
                      mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """API tokens. Members see and manage their own; owners see every token of the organization.
    DELETE revokes (the row stays, for the audit trail)."""

    model = ApiToken
    serializer_class = ApiTokenSerializer
    filterset_class = ApiTokenFilterSet
    write_role = Role.VIEWER

    def scoped_queryset(self, queryset):
        owned_orgs = self.scope.organization_ids(Role.OWNER)
        return queryset.filter(Q(user=self.request.user) | Q(organization_id__in=owned_orgs)).select_related("user")

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        organization = serializer.validated_data.get("organization")
        org_id = organization.pk if organization else self.scope.default_organization_id
        if org_id is None:
            raise exceptions.ValidationError({"organization": "you are not a member of any organization"})
        self.require_role(org_id, Role.VIEWER)
        token = ApiToken(
            organization_id=org_id, user=request.user, name=serializer.validated_data["name"],
            scope=serializer.validated_data.get("scope", "read"), expires=serializer.validated_data.get("expires"),
        )
        plaintext = token.set_new_secret()
        token.save()
        token.token = plaintext
        return Response(ApiTokenCreatedSerializer(token, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        token = self.get_object()
        if token.user_id != request.user.pk:
            self.require_role(token.organization_id, Role.OWNER)
        token.revoke()
        return Response(status=status.HTTP_204_NO_CONTENT)
