from __future__ import annotations

from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.response import Response

from api.filtersets import ApiTokenFilterSet, MembershipFilterSet
from api.serializers.tenancy import (
    ApiTokenCreatedSerializer,
    ApiTokenSerializer,
    InvitationSerializer,
    MembershipSerializer,
    OrganizationSerializer,
)
from api.viewsets import ScopedModelViewSet, ScopedViewSetMixin
from console.tenancy import services
from console.tenancy.models import ApiToken, Membership, Organization, Role


class OrganizationViewSet(ScopedModelViewSet):
    """Your organizations. Any signed-in user may create one and becomes its owner."""

    model = Organization
    serializer_class = OrganizationSerializer
    write_role = Role.OWNER
    anyone_creates = True  # any signed-in user may create an organization (api.permissions.HasWriteRole)
    http_method_names = ["get", "post", "patch", "head", "options"]

    def perform_create(self, serializer):
        if self.request.auth is not None:
            raise exceptions.PermissionDenied("API tokens belong to one organization; create organizations signed in.")
        data = serializer.validated_data
        serializer.instance = services.create_organization(data["name"], self.request.user, slug=data.get("slug"))
        self.refresh_scope()  # the new membership widens this request's scope

    def perform_update(self, serializer):
        self.require_role(serializer.instance.organization_id, Role.OWNER)
        data = serializer.validated_data
        services.rename_organization(serializer.instance, name=data.get("name"), slug=data.get("slug"))


class MembershipViewSet(ScopedModelViewSet):
    """Members of your organizations and their roles. Owners invite, change and remove members:
    POST invites the address (202, the same answer for any address); the person joins by
    accepting on the console's Invitations page, signed in with that address."""

    model = Membership
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilterSet
    write_role = Role.OWNER
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def scoped_queryset(self, queryset):
        return queryset.select_related("user")

    @extend_schema(responses={202: InvitationSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        self.require_role(data["organization"].pk)
        invitation = services.invite_member(data["organization"], data["email"], data["role"], request.user)
        return Response(InvitationSerializer(invitation).data, status=status.HTTP_202_ACCEPTED)

    def perform_update(self, serializer):
        self.require_role(serializer.instance.organization_id)
        if "role" in serializer.validated_data:
            services.change_role(serializer.instance, serializer.validated_data["role"])

    def perform_destroy(self, instance):
        services.remove_member(instance)


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
        minted = services.mint_api_token(
            org_id, request.user, name=serializer.validated_data["name"],
            scope=serializer.validated_data.get("scope", "read"), expires=serializer.validated_data.get("expires"),
            parent=request.auth if isinstance(request.auth, ApiToken) else None,
        )
        minted.token.token = minted.plaintext
        return Response(ApiTokenCreatedSerializer(minted.token, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        token = self.get_object()
        if token.user_id != request.user.pk:
            self.require_role(token.organization_id, Role.OWNER)
        services.revoke_api_token(token)
        return Response(status=status.HTTP_204_NO_CONTENT)
