from __future__ import annotations

from django.contrib.auth import get_user_model
from django.utils.text import slugify
from rest_framework import serializers

from api.fields import ScopedPrimaryKeyRelatedField
from console.tenancy.models import ApiToken, Membership, Organization
from console.tenancy.scope import Scope


class OrganizationSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField(help_text="Your role in this organization.")
    slug = serializers.SlugField(required=False, max_length=100)

    class Meta:
        model = Organization
        fields = ["id", "name", "slug", "role", "created", "updated"]
        read_only_fields = ["id", "role", "created", "updated"]

    def get_role(self, obj) -> str | None:
        request = self.context.get("request")
        return Scope.for_request(request).role_in(obj.pk) if request else None

    def validate(self, attrs):
        if "slug" not in attrs and "name" in attrs and self.instance is None:
            attrs["slug"] = slugify(attrs["name"])[:100] or "org"
        slug = attrs.get("slug")
        if slug and Organization.objects.filter(slug=slug).exclude(pk=getattr(self.instance, "pk", None)).exists():
            raise serializers.ValidationError({"slug": f"{slug!r} is taken"})
        name = attrs.get("name")
        if name and Organization.objects.filter(name=name).exclude(pk=getattr(self.instance, "pk", None)).exists():
            raise serializers.ValidationError({"name": f"an organization named {name!r} exists"})
        return attrs


class MembershipSerializer(serializers.ModelSerializer):
    organization = ScopedPrimaryKeyRelatedField(queryset=Organization.objects.all())
    email = serializers.EmailField(write_only=True, required=False, help_text="The user to add (must have an account).")
    user = serializers.SerializerMethodField()

    class Meta:
        model = Membership
        fields = ["id", "organization", "user", "email", "role", "created"]
        read_only_fields = ["id", "user", "created"]

    def get_user(self, obj) -> dict:
        return {"id": obj.user_id, "username": obj.user.get_username(), "email": obj.user.email}

    def validate(self, attrs):
        if self.instance is None:
            email = attrs.pop("email", None)
            if not email:
                raise serializers.ValidationError({"email": "required when adding a member"})
            user = get_user_model().objects.filter(email__iexact=email, is_active=True).first()
            if user is None:
                raise serializers.ValidationError({"email": f"no active user has the address {email!r}"})
            if Membership.objects.filter(organization=attrs["organization"], user=user).exists():
                raise serializers.ValidationError({"email": f"{email} is already a member"})
            attrs["user"] = user
        else:
            attrs.pop("email", None)
            if "organization" in attrs and attrs["organization"] != self.instance.organization:
                raise serializers.ValidationError({"organization": "a membership cannot move to another organization"})
        return attrs


class ApiTokenSerializer(serializers.ModelSerializer):
    organization = ScopedPrimaryKeyRelatedField(queryset=Organization.objects.all(), required=False)
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

