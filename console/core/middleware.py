"""Every HTTP request starts with no tenant scope, and leaves none behind.

The entry point that knows the caller then enters its scope: the API viewsets
(`api.viewsets.ScopedViewSetMixin`), the pages (`console.web.views.tenant_view`). Without this,
a thread that served one request could carry that request's scope into the next.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from console.core import scoping


class TenantScopeMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        with scoping.closed():
            return self.get_response(request)

    async def _acall(self, request):
        with scoping.closed():
            return await self.get_response(request)
