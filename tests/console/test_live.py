"""Live updates: published after commit only, coalesced, and heard only by those allowed."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connections, transaction

from console.fleet import services as fleet_services
from console.live.consumers import LiveConsumer
from console.live.groups import cluster_group, organization_group, parse_group
from console.live.publish import outbox, publish
from tests.factories import make_fleet


@pytest.fixture(autouse=True)
def _in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    outbox.take()
    yield
    outbox.bind_loop(None)
    outbox.take()


def test_group_names_are_valid_channels_names_and_parse_back():
    assert organization_group(3) == "o3" and cluster_group(3, 12) == "o3.c12"
    assert parse_group("o3.c12") == (3, 12) and parse_group("o3") == (3, None)
    assert parse_group("o3.c12; drop") is None and parse_group("x") is None


@pytest.mark.django_db(transaction=True)
def test_nothing_is_published_when_the_transaction_rolls_back():
    with pytest.raises(RuntimeError), transaction.atomic():
        publish(1, 2, "node", {"id": 5, "state": "lost"})
        raise RuntimeError("rolled back")
    assert outbox.take() == {}


@pytest.mark.django_db(transaction=True)
def test_a_burst_is_coalesced_latest_per_key_and_collapsed_to_a_refresh_past_the_limit(settings, monkeypatch):
    monkeypatch.setattr(outbox, "_schedule", lambda delay: None)  # inspect the outbox instead of sending
    with transaction.atomic():
        for state in ("enrolling", "ready", "lost"):
            publish(1, 2, "node", {"id": 5, "state": state})
        publish(1, 2, "node", {"id": 6, "state": "ready"})
    events = outbox.take()["o1.c2"]
    assert [(e["key"], e["data"]["state"]) for e in events] == [("5", "lost"), ("6", "ready")]

    received = []
    layer = get_channel_layer()

    async def burst():
        channel = await layer.new_channel()
        await layer.group_add("o1.c2", channel)
        for i in range(settings.LOCKSTEP["LIVE_MAX_EVENTS_PER_FLUSH"] + 1):
            outbox.put("o1.c2", {"kind": "link", "key": str(i), "data": {"id": i}})
        await outbox.flush()
        received.append(await asyncio.wait_for(layer.receive(channel), 1))

    asyncio.run(burst())
    assert received[0]["events"] == [{"kind": "refresh", "key": "", "data": {"coalesced": 51}}]


@pytest.mark.django_db(transaction=True)
def test_a_prompt_event_is_sent_at_once_with_what_is_pending_and_others_wait_to_coalesce(monkeypatch):
    from console.live.publish import COALESCE_WINDOW_S

    outbox.take()
    flushes = []
    monkeypatch.setattr(outbox, "_schedule", flushes.append)
    with transaction.atomic():
        publish(1, 2, "element", {"id": 1, "health": "down"})
        publish(1, 2, "probe_window", {"id": 7}, key="latest")
    assert flushes == [COALESCE_WINDOW_S]  # one flush for the burst, after the coalescing wait
    with transaction.atomic():
        publish(1, 2, "incident", {"id": 3, "state": "open"}, prompt=True)
    assert flushes == [COALESCE_WINDOW_S, 0.0]  # not held back by the flush already scheduled
    assert [e["kind"] for e in outbox.take()["o1.c2"]] == ["element", "probe_window", "incident"]


async def _connect(user):
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_member_hears_a_change_and_an_outsider_is_denied_and_hears_nothing(django_user_model):
    from tests.conftest import World

    world = await sync_to_async(World)(django_user_model)
    fleet = await sync_to_async(make_fleet)(world.acme)
    acme_group = cluster_group(world.acme.pk, fleet.cluster.pk)

    bob = await _connect(world.users["bob"])
    await bob.send_json_to({"subscribe": [acme_group, organization_group(world.globex.pk)]})
    reply = await bob.receive_json_from()
    assert reply == {"type": "subscribed", "groups": [acme_group], "denied": [organization_group(world.globex.pk)]}

    charlie = await _connect(world.users["charlie"])
    await charlie.send_json_to({"subscribe": [acme_group, organization_group(world.acme.pk)]})
    assert (await charlie.receive_json_from())["groups"] == []

    await sync_to_async(fleet_services.drain)(fleet.node)  # commits: the event goes out after the commit
    heard = []
    while not any(e["kind"] == "node" and e["data"]["state"] == "draining" for e in heard):
        message = await bob.receive_json_from(timeout=3)
        assert message["type"] == "events" and message["group"] == acme_group
        heard.extend(message["events"])
    assert await charlie.receive_nothing(timeout=0.5)
    await bob.disconnect()
    await charlie.disconnect()
    await sync_to_async(connections.close_all)()  # the worker thread's connection, before the test DB goes


@pytest.mark.asyncio
async def test_an_anonymous_socket_is_closed():
    from django.contrib.auth.models import AnonymousUser

    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = AnonymousUser()
    connected, code = await communicator.connect()
    assert not connected and code == 4401


class RecordingLayer:
    """A channel layer that keeps what is sent (the Redis layer's interface, no server)."""

    sent: list[tuple[str, dict]] = []

    def __init__(self, **_):
        pass

    async def group_send(self, group, message):
        self.sent.append((group, message))


def test_a_stopped_server_drains_the_outbox_and_a_late_delivery_timer_starts_no_event_loop(settings, monkeypatch):
    import asgiref.sync
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.RecordingLayer"}}
    channel_layers.backends.clear()
    RecordingLayer.sent.clear()
    monkeypatch.setattr(outbox, "_schedule", lambda delay: None)  # the timer is fired by hand below
    outbox.put("o1.c2", {"kind": "node", "key": "5", "data": {"state": "ready"}})
    outbox.put("o1.c2", {"kind": "node", "key": "6", "data": {"state": "ready"}})

    outbox.drain()
    assert [(g, [e["key"] for e in m["events"]]) for g, m in RecordingLayer.sent] == [("o1.c2", ["5", "6"])]

    loops = []
    monkeypatch.setattr(asgiref.sync, "async_to_sync", lambda fn: loops.append(fn))
    outbox._flush_blocking()  # what the timer runs, as the interpreter exits
    assert loops == [] and len(RecordingLayer.sent) == 1
    channel_layers.backends.clear()
