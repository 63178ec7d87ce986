"""What one caller may see and do: for each organization it can reach, the role it holds there.

A `Scope` is computed once per request from the authenticated principal (a session user or an
API token). `scope.active()` makes its organizations the active tenant scope
(`console.core.scoping`), which every tenant-owned query then obeys: the viewsets, pages and
websocket consumers enter it at their entry point, so no view filters by hand. Roles decide
what the caller may *change* (`can`, `require_role` in the views).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from console.core import scoping
from console.tenancy.models import ApiToken, Membership, Role, TokenScope

SESSION_ORGANIZATION_KEY = "organization_id"


@dataclass(frozen=True)
class Scope:
    roles: Mapping[int, str] = field(default_factory=dict)
    # Where new top-level objects go when the request names no organization.
    default_organization_id: int | None = None
    token: ApiToken | None = None

    @classmethod
    def empty(cls) -> Scope:
        return cls()

    @classmethod
    def for_user(cls, user, active_organization_id: int | None = None) -> Scope:
        if user is None or not user.is_authenticated or not user.is_active:
            return cls.empty()
        with scoping.unscoped("find the organizations of the signed-in user"):
            roles = dict(Membership.objects.filter(user=user).values_list("organization_id", "role"))
        default = active_organization_id if active_organization_id in roles else None
        if default is None and roles:
            default = min(roles)
        return cls(roles=roles, default_organization_id=default)

    @classmethod
    def for_token(cls, token: ApiToken) -> Scope:
        with scoping.unscoped("find the role of an API token's creator"):
            role = (
                Membership.objects.filter(user_id=token.user_id, organization_id=token.organization_id)
                .values_list("role", flat=True)
                .first()
            )
        if role is None or not token.user.is_active:
            return cls.empty()
        if token.scope == TokenScope.READ:
            role = Role.VIEWER
        return cls(
            roles={token.organization_id: role},
            default_organization_id=token.organization_id,
            token=token,
        )

    @classmethod
    def for_request(cls, request) -> Scope:
        """The scope of a Django or DRF request (token first, then session)."""
        cached = getattr(request, "_lockstep_scope", None)
        if cached is not None:
            return cached
        auth = getattr(request, "auth", None)
        if isinstance(auth, ApiToken):
            scope = cls.for_token(auth)
        else:
            session = getattr(request, "session", None)
            active = session.get(SESSION_ORGANIZATION_KEY) if session is not None else None
            scope = cls.for_user(getattr(request, "user", None), active)
        request._lockstep_scope = scope
        return scope

    def role_in(self, organization_id: int | None) -> str | None:
        return self.roles.get(organization_id)

    def can(self, organization_id: int | None, min_role: str = Role.VIEWER) -> bool:
        role = self.roles.get(organization_id)
        return role is not None and Role.rank(role) >= Role.rank(min_role)

    def organization_ids(self, min_role: str = Role.VIEWER) -> list[int]:
        return sorted(org for org, role in self.roles.items() if Role.rank(role) >= Role.rank(min_role))

    def active(self):
        """A context in which tenant-owned queries see this caller's organizations, and only those."""
        return scoping.for_organizations(self.roles)
