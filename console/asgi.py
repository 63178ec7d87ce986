"""ASGI entry point: Django for HTTP, Channels for websockets.

Agent traffic (`/api/v1/agent/`) goes to a Django handler without the browser middleware:
those routes use neither sessions, CSRF, messages nor redirects, and under ASGI every sync
middleware costs thread hops per request — the larger share of an agent request's CPU.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_http = get_asgi_application()  # before importing anything that touches models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.layers import get_channel_layer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from console.agent_handler import AgentASGIHandler  # noqa: E402
from console.core.bodylimit import BoundedBody  # noqa: E402
from console.live.origin import SameOriginValidator  # noqa: E402
from console.live.routing import websocket_urlpatterns  # noqa: E402

AGENT_PREFIX = "/api/v1/agent/"

# Channels imports the layer's backend on first use. The first requests run in several
# threads at once, and two threads importing channels_redis together deadlock on redis's
# circular import (redis/__init__ imports redis.asyncio): import it here, in one thread.
get_channel_layer()


def http_router(agent_app, browser_app):
    async def route(scope, receive, send):
        app = agent_app if scope["path"].startswith(AGENT_PREFIX) else browser_app
        await app(scope, receive, send)

    return route


application = ProtocolTypeRouter(
    {
        "http": BoundedBody(http_router(AgentASGIHandler(), ASGIStaticFilesHandler(django_http))),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
