"""Request bodies bounded per route, before Django reads them.

Django's ASGI handler reads a whole body (spooled to a temporary file) before any view or
middleware runs, so a view's own size check comes after the disk and the memory were spent: an
anonymous 1 GiB POST to the login page was written in full before its 403. This ASGI middleware
sits in front of Django and answers 413 as soon as a body is known to be too large: on its
`Content-Length` before reading anything, and on the bytes received for a body sent without one
(chunked). Only the routes that need it take large bodies (a topology import, telemetry and
command results, inventory); everything else, anonymous or not, takes BODY_MAX_BYTES.
"""

from __future__ import annotations

import json
import re

from django.conf import settings

_AGENT = "/api/v1/agent/"
_TOPOLOGY = re.compile(r"^/api/v1/clusters/[^/]+/topology/?$")
_RESULT = re.compile(r"^/api/v1/agent/commands/[^/]+/result/?$")


def body_limit(method: str, path: str) -> int:
    """The most bytes a request to `path` may carry."""
    limits = settings.LOCKSTEP
    if path.startswith(_AGENT):
        rest = path[len(_AGENT):].rstrip("/")
        if rest == "telemetry" or _RESULT.match(path):
            return limits["TELEMETRY_MAX_BATCH_BYTES"]
        if rest == "inventory":
            return limits["INVENTORY_MAX_BYTES"]
        return limits["AGENT_BODY_MAX_BYTES"]
    if method in ("PUT", "POST") and _TOPOLOGY.match(path):
        return limits["TOPOLOGY_MAX_BYTES"]
    return limits["BODY_MAX_BYTES"]


def _too_large(limit: int, size: int | None) -> list[dict]:
    said = f"The body is {size} bytes" if size is not None else "The body is larger than the limit"
    payload = json.dumps({"error": "too_large", "detail": f"{said}; this route takes at most {limit} bytes."})
    return [
        {"type": "http.response.start", "status": 413,
         "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]},
        {"type": "http.response.body", "body": payload.encode()},
    ]


class BoundedBody:
    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.application(scope, receive, send)
        limit = body_limit(scope["method"], scope["path"])
        declared = next((value for key, value in scope.get("headers", ()) if key == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > limit:
            for message in _too_large(limit, int(declared)):
                await send(message)
            return None
        received = 0
        refused = False

        async def bounded_receive():
            # Counts what arrives; past the limit the client is answered 413 here and the app is told
            # the client went away (Django then stops reading and answers nothing itself).
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    for reply in _too_large(limit, None):
                        await send(reply)
                    return {"type": "http.disconnect"}
            return message

        return await self.application(scope, bounded_receive, send)
