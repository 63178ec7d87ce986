"""The one way to push a live update to browsers.

`publish()` never sends inside a transaction: the event is handed to an outbox when the
transaction commits (and dropped if it rolls back). The outbox waits a short window (a *prompt*
event, such as an incident opening, does not wait: it goes out with what is pending at once),
then sends one message per group, keeping only the latest event per (kind, key), and collapsing a burst of
more than LIVE_MAX_EVENTS_PER_FLUSH events into a single `refresh` (a topology import of a
thousand rows is one message, not a thousand). Persistence never depends on delivery.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import partial

from django.conf import settings
from django.db import transaction

from console.live.groups import cluster_group, organization_group, user_group

log = logging.getLogger(__name__)
COALESCE_WINDOW_S = 0.1
# A flush scheduled this long ago that has not run (its loop stopped) is scheduled again.
STALE_FLUSH_S = 2.0


def publish(organization_id: int, cluster_id: int | None, kind: str, data: dict, key: str | None = None,
            prompt: bool = False) -> None:
    """Send `{kind, key, data}` to the cluster's group (or the organization's) after commit;
    `prompt`: without the coalescing wait."""
    group = cluster_group(organization_id, cluster_id) if cluster_id else organization_group(organization_id)
    event = {"kind": kind, "key": key if key is not None else str(data.get("id", "")), "data": data}
    transaction.on_commit(partial(outbox.put, group, event, prompt))


def publish_access_changed(user_id: int) -> None:
    """Tell the user's open sockets, after commit, that their memberships changed: each one
    re-checks the groups it joined (console.live.consumers)."""
    transaction.on_commit(partial(outbox.put, user_group(user_id), {"kind": "access", "key": "", "data": {}}))


class Outbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, dict[tuple[str, str], dict]] = {}
        self._scheduled_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver on this event loop (the ASGI server's, where websocket consumers live)."""
        self._loop = loop

    def put(self, group: str, event: dict, prompt: bool = False) -> None:
        with self._lock:
            per_group = self._events.setdefault(group, {})
            per_group.pop((event["kind"], event["key"]), None)  # keep the latest, in arrival order
            per_group[(event["kind"], event["key"])] = event
            now = time.monotonic()
            if not prompt and self._scheduled_at is not None and now - self._scheduled_at < STALE_FLUSH_S:
                return
            self._scheduled_at = now
        # a prompt event's flush runs now; one already scheduled finds what came after it, if anything
        self._schedule(0.0 if prompt else COALESCE_WINDOW_S)

    def _schedule(self, delay: float) -> None:
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        loop = self._loop
        if loop is not None and not loop.is_closed() and loop.is_running():
            loop.call_soon_threadsafe(loop.call_later, delay, self._flush_on_loop)
        elif not isinstance(get_channel_layer(), InMemoryChannelLayer):
            # A process without websocket clients (a Celery worker): send through Redis.
            timer = threading.Timer(delay, self._flush_blocking)
            timer.daemon = True
            timer.start()
        else:
            # An in-memory layer and no event loop serving sockets: nobody can be listening.
            self.take()

    def take(self) -> dict[str, list[dict]]:
        with self._lock:
            events, self._events, self._scheduled_at = self._events, {}, None
        return {group: list(per_group.values()) for group, per_group in events.items()}

    def _flush_on_loop(self) -> None:
        asyncio.ensure_future(self.flush())

    def _flush_blocking(self) -> None:
        from asgiref.sync import async_to_sync

        # Take first: a timer that fires as the process exits finds nothing left (serve drains the
        # outbox before it returns) and must not start an event loop while the interpreter shuts down.
        pending = self.take()
        if pending:
            async_to_sync(self._send)(pending)

    def drain(self) -> None:
        """Send what is pending now, from this thread (a server whose event loop has stopped)."""
        from channels.layers import InMemoryChannelLayer, get_channel_layer

        if isinstance(get_channel_layer(), InMemoryChannelLayer):
            self.take()  # its sockets were served by the stopped loop: nobody is listening
        else:
            self._flush_blocking()

    async def flush(self) -> None:
        await self._send(self.take())

    async def _send(self, pending: dict[str, list[dict]]) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        limit = settings.LOCKSTEP["LIVE_MAX_EVENTS_PER_FLUSH"]
        for group, events in pending.items():
            if len(events) > limit:
                events = [{"kind": "refresh", "key": "", "data": {"coalesced": len(events)}}]
            try:
                await layer.group_send(group, {"type": "live.events", "group": group, "events": events})
            except Exception as exc:  # browsers fall back to polling; nothing stored is lost
                log.warning("event=live_send_failed group=%s error=%r", group, exc)


outbox = Outbox()
