from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response


class AgentASGIHandler(ASGIHandler):
    """Django's ASGI handler with no middleware at all, for the agent endpoints: they are async
    views that authenticate with node credentials and answer JSON (see api/agent/views.py)."""

    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)
