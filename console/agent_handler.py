"""Django's ASGI handler trimmed for the agent endpoints (`/api/v1/agent/`).

They are async views that authenticate with node credentials, do their database work on their
own thread pool (`console/core/asyncdb.py`) and answer JSON. So this handler runs no middleware
and sends no request_started/request_finished signals: under ASGI each sync middleware and each
sync signal receiver costs a hop to a thread created per request, which was most of an agent
request's CPU. Client disconnects still cancel the view (a long poll whose agent went away
claims nothing).
"""

from __future__ import annotations

import asyncio
import contextlib

from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.exception import convert_exception_to_response
from django.urls import set_script_prefix


class AgentASGIHandler(ASGIHandler):
    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)

    async def handle(self, scope, receive, send):
        from console.telemetry.shares import early_refusal  # after Django is set up

        refusal = early_refusal(scope)
        if refusal is not None:  # a node's extra telemetry batch: answered before its body is read
            for message in refusal:
                await send(message)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        with body_file:
            set_script_prefix(get_script_prefix(scope))
            request, error_response = self.create_request(scope, body_file)
            if request is None:
                await self.send_response(error_response, send)
                return

            async def respond():
                response = await self.run_get_response(request)
                with contextlib.suppress(asyncio.CancelledError):  # the client went away meanwhile
                    await self.send_response(response, send)

            disconnect = asyncio.create_task(self.listen_for_disconnect(receive))
            answer = asyncio.create_task(respond())
            try:
                await asyncio.wait([disconnect, answer], return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when this request is cancelled (a server shutdown that ran out of time)
                for task in (disconnect, answer):
                    if not task.done():
                        task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                        await task
