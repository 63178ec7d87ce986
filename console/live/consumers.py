"""Browser websocket: subscribe to organization and cluster groups, receive live events.

Client → `{"subscribe": ["o3", "o3.c12"]}`; server → `{"type": "subscribed", "groups": [...],
"denied": [...]}`. Access is checked per group at subscribe time; a group the user cannot see
is denied exactly like one that does not exist. Events arrive as
`{"type": "events", "group": "o3.c12", "events": [{"kind", "key", "data"}]}`.

Access is checked again whenever the user's memberships change (a member removed, a role
changed: `publish_access_changed` reaches the user's own group): the groups no longer visible
are left and the client is told `{"type": "access_changed", "groups": [...], "dropped": [...]}`;
a user left with no organization (or deactivated) has the socket closed with 4403.
"""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.live.groups import parse_group, user_group
from console.live.publish import outbox

MAX_GROUPS = 50


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        outbox.bind_loop(asyncio.get_running_loop())
        self.groups_joined: set[str] = set()
        self.access_group = user_group(user.pk)
        await self.channel_layer.group_add(self.access_group, self.channel_name)
        await self.accept()

    async def disconnect(self, code) -> None:
        for group in getattr(self, "groups_joined", set()):
            await self.channel_layer.group_discard(group, self.channel_name)
        if hasattr(self, "access_group"):
            await self.channel_layer.group_discard(self.access_group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        # A frame that is not JSON text answers an error and keeps the socket (the JSON consumer
        # would raise and drop it).
        if text_data is None:
            await self.send_json({"type": "error", "detail": "messages are JSON text frames, not binary"})
            return
        try:
            content = await self.decode_json(text_data)
        except ValueError as exc:  # JSONDecodeError, and RecursionError's cousin for deep nesting below
            await self.send_json({"type": "error", "detail": f"the message is not JSON: {exc}"})
            return
        except RecursionError:
            await self.send_json({"type": "error", "detail": "the message is nested too deeply"})
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content, **kwargs) -> None:
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "detail": "messages are JSON objects"})
            return
        if "subscribe" in content:
            await self._subscribe(content["subscribe"])
        elif "unsubscribe" in content:
            await self._unsubscribe(content["unsubscribe"])
        else:
            await self.send_json({"type": "error", "detail": "expected 'subscribe' or 'unsubscribe'"})

    async def _subscribe(self, names) -> None:
        if not isinstance(names, list) or len(names) > MAX_GROUPS:
            await self.send_json({"type": "error", "detail": f"'subscribe' takes a list of at most {MAX_GROUPS} groups"})
            return
        allowed, denied = await self._check(names)
        for group in allowed:
            if group not in self.groups_joined:
                await self.channel_layer.group_add(group, self.channel_name)
                self.groups_joined.add(group)
        await self.send_json({"type": "subscribed", "groups": sorted(self.groups_joined), "denied": denied})

    async def _unsubscribe(self, names) -> None:
        if not isinstance(names, list):
            await self.send_json({"type": "error", "detail": "'unsubscribe' takes a list of groups"})
            return
        for group in names:
            if isinstance(group, str) and group in self.groups_joined:
                await self.channel_layer.group_discard(group, self.channel_name)
                self.groups_joined.discard(group)
        await self.send_json({"type": "subscribed", "groups": sorted(self.groups_joined), "denied": []})

    async def _recheck(self) -> None:
        """The user's memberships changed: keep only the groups still visible."""
        allowed, dropped = await self._check(sorted(self.groups_joined))
        for group in dropped:
            await self.channel_layer.group_discard(group, self.channel_name)
            self.groups_joined.discard(group)
        if not await self._has_organizations():
            await self.close(code=4403)
            return
        await self.send_json({"type": "access_changed", "groups": sorted(self.groups_joined), "dropped": dropped})

    @database_sync_to_async
    def _has_organizations(self) -> bool:
        return bool(self._fresh_scope().roles)

    def _fresh_scope(self):
        """The user's scope as the database says now (the socket's user object is from connect)."""
        from django.contrib.auth import get_user_model

        from console.tenancy.scope import Scope

        return Scope.for_user(get_user_model().objects.filter(pk=self.scope["user"].pk).first())

    @database_sync_to_async
    def _check(self, names) -> tuple[list[str], list]:
        from console.fleet.models import Cluster

        scope = self._fresh_scope()
        allowed, denied = [], []
        with scope.active():  # the consumer's entry point: the user's organizations, nothing else
            for name in names:
                parsed = parse_group(name)
                if parsed is None:
                    denied.append(name)
                    continue
                org_id, cluster_id = parsed
                visible = scope.can(org_id) and (
                    cluster_id is None or Cluster.objects.filter(pk=cluster_id, organization_id=org_id).exists()
                )
                (allowed if visible else denied).append(name)
        return allowed, denied

    async def live_events(self, message) -> None:
        if message["group"] == self.access_group:
            await self._recheck()
        elif message["group"] in self.groups_joined:
            await self.send_json({"type": "events", "group": message["group"], "events": message["events"]})
