"""What every page answers with, whatever the mode: a Content-Security-Policy, and error pages
that show neither settings nor a traceback.

The policy (settings.CONTENT_SECURITY_POLICY) allows scripts, styles and connections from this
console only and no inline code, so markup injected into a page cannot run; the pages keep their
scripts and styles in templates/static/. A view that needs another policy sets the header itself.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.views.debug import ExceptionReporter


class ContentSecurityPolicyMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        return self._with_policy(self.get_response(request))

    async def _acall(self, request):
        return self._with_policy(await self.get_response(request))

    @staticmethod
    def _with_policy(response):
        response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        return response


class LogOnlyExceptionReporter(ExceptionReporter):
    """DEBUG's error page without the settings, the environment or the traceback (those went to the
    log, `django.request`): a development console reachable by others shows them nothing."""

    MESSAGE = "Server error (500). The traceback is in the console's log."

    def get_traceback_html(self) -> str:
        return f"<!doctype html><title>Server error</title><h1>Server error (500)</h1><p>{self.MESSAGE}</p>\n"

    def get_traceback_text(self) -> str:
        return self.MESSAGE + "\n"
