"""The active tenant scope: which organizations the running code may read and write.

Every tenant-owned model's default manager consults it (`console.core.models.TenantManager`)
and refuses to run a query when none is active: forgetting to scope fails closed, with
`TenantScopeError`, instead of showing every tenant's rows. A scope is entered in one place per
entry point and reset when that entry point is done:

- API viewsets: `api.viewsets.ScopedViewSetMixin` (the caller's organizations);
- browser views: `console.web.views.tenant_view`; websocket consumers: `LiveConsumer._check`;
- every HTTP request starts closed (`console.core.middleware.TenantScopeMiddleware`), every
  agent request too (`api.agent.views.agent_endpoint`), every Celery task too
  (`console.celery`), so a scope never leaks from one request or task into the next.

Code that is not a tenant's request says which organization it works for, or that it works
across all of them, in a sentence:

    with for_organization(node.organization_id): ...     # an agent's request, a task for one org
    with unscoped("sweep every organization's silent nodes"): ...

`unscoped` is meant to be rare and greppable (`git grep -n 'unscoped("'` lists every use).

A scope is a `contextvars.ContextVar`, so it follows the code into threads started through
asgiref (`sync_to_async`, Channels' `database_sync_to_async`) and into asyncio tasks, and never
leaks between requests served by one reused thread.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "ActiveScope",
    "TenantMismatch",
    "TenantScopeError",
    "active",
    "closed",
    "enter",
    "for_organization",
    "for_organizations",
    "require_writable",
    "reset",
    "unscoped",
]


class TenantScopeError(RuntimeError):
    """Tenant-owned rows were touched with no scope active, or outside the active one.

    Always a programming error (an entry point that forgot to scope, or a service writing into
    the wrong organization), never a user's: it is not translated into a 4xx."""


class TenantMismatch(TenantScopeError):
    """A child row names another organization (or cluster, or node) than its parent."""


@dataclass(frozen=True)
class ActiveScope:
    # None: every organization (an explicit `unscoped(reason)`).
    organization_ids: frozenset[int] | None
    reason: str = ""

    @property
    def is_unscoped(self) -> bool:
        return self.organization_ids is None

    def allows(self, organization_id: int | None) -> bool:
        return self.organization_ids is None or organization_id in self.organization_ids

    def describe(self) -> str:
        if self.organization_ids is None:
            return f"unscoped ({self.reason})"
        return f"organizations {sorted(self.organization_ids)}"


_active: contextvars.ContextVar[ActiveScope | None] = contextvars.ContextVar("lockstep_tenant_scope", default=None)


def active() -> ActiveScope | None:
    """The scope in force here, or None (closed: tenant-owned queries raise)."""
    return _active.get()


def enter(scope: ActiveScope | None) -> contextvars.Token:
    """Make `scope` active until `reset(token)`; for entry points that cannot use a `with` block
    (a DRF view enters in `initial()` and resets in `dispatch()`)."""
    return _active.set(scope)


def reset(token: contextvars.Token) -> None:
    _active.reset(token)


@contextlib.contextmanager
def _scoped(scope: ActiveScope | None) -> Iterator[None]:
    token = _active.set(scope)
    try:
        yield
    finally:
        _active.reset(token)


def for_organizations(organization_ids: Iterable[int]) -> contextlib.AbstractContextManager[None]:
    """Queries see, and writes may touch, only these organizations (an empty set: nothing)."""
    return _scoped(ActiveScope(frozenset(int(i) for i in organization_ids)))


def for_organization(organization_id: int) -> contextlib.AbstractContextManager[None]:
    """Work done for one organization: an agent's request, a task about one tenant's cluster."""
    return for_organizations([organization_id])


def unscoped(reason: str) -> contextlib.AbstractContextManager[None]:
    """Work across every organization, said out loud: authentication, sweeps, the demo seed."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("unscoped() needs a reason: say why this code may see every organization")
    return _scoped(ActiveScope(None, reason.strip()))


def closed() -> contextlib.AbstractContextManager[None]:
    """No scope: how every entry point starts, before it knows who is calling."""
    return _scoped(None)


def require_writable(organization_id: int | None, what: str) -> None:
    """Raise TenantScopeError unless the active scope may write rows of this organization."""
    scope = _active.get()
    if scope is None:
        raise TenantScopeError(
            f"{what}: no tenant scope is active. Enter one at the entry point "
            "(for_organization(id), or unscoped('why') for cross-tenant work)."
        )
    if not scope.allows(organization_id):
        raise TenantScopeError(f"{what}: organization {organization_id} is outside the active scope "
                               f"({scope.describe()})")
