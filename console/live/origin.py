"""The websocket's Origin check, the same in every mode.

A browser sends the session cookie with a websocket handshake from any site, so a page elsewhere
could open a socket as the signed-in user (cross-site websocket hijacking). Only the console's own
pages may: the Origin must name the host the handshake was sent to, or one of CSRF_TRUSTED_ORIGINS
(a proxy that rewrites Host). `ALLOWED_HOSTS = *` no longer means any origin.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.http.request import split_domain_port, validate_host


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


def origin_allowed(origin: str, host: str) -> bool:
    """True when `origin` (the Origin header) is this console's: same host[:port] as `host` (the
    Host header), or listed in CSRF_TRUSTED_ORIGINS."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    if origin.rstrip("/") in (o.rstrip("/") for o in settings.CSRF_TRUSTED_ORIGINS):
        return True
    default_port = {"http": "80", "https": "443"}[parts.scheme]
    origin_host = parts.netloc if ":" in parts.netloc.rsplit("]", 1)[-1] else f"{parts.netloc}:{default_port}"
    if not host or not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        return False
    request_host = host if ":" in host.rsplit("]", 1)[-1] else f"{host}:{default_port}"
    return origin_host.lower() == request_host.lower()


class SameOriginValidator:
    """ASGI middleware for websockets: a handshake whose Origin is not this console's is refused
    (403 before the consumer runs)."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(_header(scope, b"origin"), _header(scope, b"host")):
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 4403})
            return None
        return await self.application(scope, receive, send)
