"""The base of every tenant-facing API view: it enters the caller's tenant scope, in one place.

`initial()` (after authentication) makes the caller's organizations the active tenant scope
(`console.core.scoping`); `dispatch()` starts closed and resets whatever was active before when
the response is rendered. So every query the view runs — its queryset, `get_object()`, DRF
related fields, django-filter choices (`?cluster=<id>`), serializer validation — sees the
caller's organizations only, by the same mechanism: another tenant's id is "not found" exactly
like an id that does not exist.

Subclasses set `model` and may narrow the queryset in `scoped_queryset()`; they cannot override
`get_queryset`, `initial` or `dispatch`. They write only through the app's service module
(`perform_create`/`perform_update`/`perform_destroy` call it after `require_role()`; the
defaults refuse), and the tenant scope itself refuses a write into an organization the caller
cannot see.
"""

from __future__ import annotations

from rest_framework import exceptions, viewsets

from api.permissions import HasWriteRole
from console.core import scoping
from console.tenancy.models import Role
from console.tenancy.scope import Scope

_FINAL = ("get_queryset", "initial", "dispatch")


class ScopedViewSetMixin:
    model = None
    write_role = Role.OPERATOR
    permission_classes = [HasWriteRole]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in _FINAL:
            if name in cls.__dict__:
                raise TypeError(f"{cls.__name__} must not override {name}(); narrow the queryset in scoped_queryset()")

    @property
    def scope(self) -> Scope:
        return Scope.for_request(self.request)

    def scoped_queryset(self, queryset):
        return queryset

    def get_queryset(self):
        if self.model is None:
            raise TypeError(f"{type(self).__name__} sets no model")
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, no rows
            return self.model.objects.none()
        return self.scoped_queryset(self.model.objects.all())

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        # After authentication: the caller is known, and so are its organizations.
        scoping.enter(scoping.ActiveScope(frozenset(Scope.for_request(request).roles)))

    def dispatch(self, request, *args, **kwargs):
        token = scoping.enter(None)
        try:
            response = super().dispatch(request, *args, **kwargs)
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()  # still in the caller's scope: the browsable API lists related choices
            return response
        finally:
            scoping.reset(token)

    def refresh_scope(self) -> None:
        """Re-read the caller's organizations (after this request made them one more)."""
        self.request._lockstep_scope = None
        scoping.enter(scoping.ActiveScope(frozenset(Scope.for_request(self.request).roles)))

    def require_role(self, organization_id: int, role: str | None = None) -> None:
        """404 when the organization is invisible to the caller, 403 when the role is too low."""
        role = role or self.write_role
        if self.scope.role_in(organization_id) is None:
            raise exceptions.NotFound()
        if not self.scope.can(organization_id, role):
            raise exceptions.PermissionDenied(
                f"This needs the {role} role in this organization (yours: {self.scope.role_in(organization_id)})."
            )

    # Writes go through the app's service module (console/<app>/services.py), the one writer of its
    # domain: a viewset that writes says which service function it calls.
    def perform_create(self, serializer):
        raise NotImplementedError(f"{type(self).__name__}: create through the app's services module")

    def perform_update(self, serializer):
        raise NotImplementedError(f"{type(self).__name__}: update through the app's services module")

    def perform_destroy(self, instance):
        raise NotImplementedError(f"{type(self).__name__}: delete through the app's services module")


class ScopedModelViewSet(ScopedViewSetMixin, viewsets.ModelViewSet):
    pass


class ScopedReadOnlyViewSet(ScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    pass
