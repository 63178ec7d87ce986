from console.tenancy.models import Organization
from console.tenancy.scope import Scope


def organizations(request) -> dict:
    """The organization switcher: the user's organizations and the active one."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    scope = Scope.for_request(request)
    with scope.active():  # templates rendered outside a tenant_view (the API docs) ask too
        orgs = list(Organization.objects.all())
    active = next((o for o in orgs if o.pk == scope.default_organization_id), None)
    return {"organizations": orgs, "active_organization": active, "active_role": scope.role_in(getattr(active, "pk", None))}
