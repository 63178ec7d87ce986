from __future__ import annotations

from rest_framework import serializers

from api.serializers.base import StrictModelSerializer
from console.tenancy.models import ApiToken, Invitation, Membership, Organization, Role
from console.tenancy.scope import Scope


class OrganizationSerializer(StrictModelSerializer):
    role = serializers.SerializerMethodField(help_text="Your role in this organization.")
    # Names and slugs are unique across tenants: the service checks them (a scoped validator could not).
    name = serializers.CharField(max_length=100)
    slug = serializers.SlugField(required=False, max_length=100)

    class Meta:
        model = Organization
        fields = ["id", "name", "slug", "role", "created", "updated"]
        read_only_fields = ["id", "role", "created", "updated"]

    def get_role(self, obj) -> str | None:
        request = self.context.get("request")
        return Scope.for_request(request).role_in(obj.pk) if request else None


class MembershipSerializer(StrictModelSerializer):
    # Resolved in the caller's tenant scope (the default manager): another tenant's id is "does not exist".
    organization = serializers.PrimaryKeyRelatedField(queryset=Organization.objects.all())
    email = serializers.EmailField(write_only=True, required=False, max_length=254,
                                   help_text="Whom to invite: they join once they accept, signed in with this address.")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.VIEWER)
    user = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = ["id", "organization", "user", "email", "role", "created"]
        read_only_fields = ["id", "user", "created"]
        validators = []  # one membership per user and organization: the service checks it

    def get_user(self, obj) -> dict:
        return {"id": obj.user_id, "username": obj.user.get_username(), "email": obj.user.email}

    def validate(self, attrs):
        if self.instance is None:
            if not attrs.get("email"):
                raise serializers.ValidationError({"email": "required when adding a member"})
        else:
            attrs.pop("email", None)
            if "organization" in attrs and attrs["organization"] != self.instance.organization:
                raise serializers.ValidationError({"organization": "a membership cannot move to another organization"})
        return attrs


class InvitationSerializer(StrictModelSerializer):
    """What adding a member answers: the invitation, the same for any address."""

    class Meta:
        model = Invitation
        fields = ["id", "organization", "email", "role", "expires", "created"]
        read_only_fields = fields


class ApiTokenSerializer(StrictModelSerializer):
    organization = serializers.PrimaryKeyRelatedField(queryset=Organization.objects.all(), required=False)
    prefix = serializers.CharField(source="prefix_display", read_only=True)
    user = serializers.CharField(source="user.get_username", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "organization", "user", "name", "scope", "prefix", "expires", "last_used", "revoked_at", "created"]
        read_only_fields = ["id", "user", "prefix", "last_used", "revoked_at", "created"]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its digest is stored.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
