"""Who may call what. Reading needs membership; writing needs the view's write role and, for
API tokens, the write scope. Objects outside the caller's organizations never get this far:
the scoped queryset does not contain them, so they answer 404."""

from __future__ import annotations

from rest_framework import permissions

from console.tenancy.models import ApiToken, Role, TokenScope
from console.tenancy.scope import Scope


class IsOrganizationMember(permissions.BasePermission):
    message = "Authentication required."

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        read_only = isinstance(request.auth, ApiToken) and request.auth.scope == TokenScope.READ
        if read_only and request.method not in permissions.SAFE_METHODS:
            self.message = "This API token has the read scope; use a write-scoped token to make changes."
            return False
        return True


class HasWriteRole(IsOrganizationMember):
    """Unsafe methods need `view.write_role` (operator by default) in the object's organization."""

    message = "Your role in this organization does not allow this change."

    def has_permission(self, request, view) -> bool:
        if not super().has_permission(request, view):
            return False
        # A create names its organization in the body: refuse a caller who may create in none of
        # theirs before the body is parsed (updates and actions check the object first anyway).
        if getattr(view, "action", None) == "create" and not getattr(view, "anyone_creates", False):
            role = getattr(view, "write_role", Role.OPERATOR)
            if not Scope.for_request(request).organization_ids(role):
                self.message = f"This needs the {role} role in one of your organizations."
                return False
        return True

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        role = getattr(view, "write_role", Role.OPERATOR)
        return Scope.for_request(request).can(obj.organization_id, role)
