"""Websocket access is checked again when memberships change (issue 9, finding 3), through the
real server: a member removed by the owner stops hearing the organization on a socket that was
already open, keeps what another membership still shows, and a user left with no organization
has the socket closed."""

from __future__ import annotations

import asyncio
import json

import pytest
import requests
import websockets
from django.test import Client

from console.tenancy.models import Membership, Role
from tests.conftest import World
from tests.factories import make_fleet

pytestmark = pytest.mark.slow


@pytest.fixture
def world(transactional_db, django_user_model):
    return World(django_user_model)


def _socket_headers(world, live_console, name: str) -> dict:
    client = Client()
    client.force_login(world.users[name])
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}", "Origin": live_console}


def _socket(live_console, headers: dict):
    return websockets.connect(live_console.replace("http://", "ws://") + "/ws/live/", additional_headers=headers)


class Api:
    """Each person's API calls to the real server, with tokens minted before the event loop runs."""

    def __init__(self, world, live_console, *names):
        self.base = live_console
        self.tokens = {name: world.token(name) for name in names}

    async def __call__(self, name: str, method: str, path: str, body=None):
        return await asyncio.to_thread(requests.request, method, f"{self.base}/api/v1/{path}", json=body, timeout=10,
                                       headers={"Authorization": f"Bearer {self.tokens[name]}"})


async def _next(ws, wanted: str) -> dict:
    """The next message of type `wanted` (events of still-joined groups may come first)."""
    while True:
        message = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if message["type"] == wanted:
            return message


def test_a_removed_member_stops_hearing_the_organization_on_an_open_socket(world, live_console):
    fleet = make_fleet(world.acme)
    Membership.objects.create(organization=world.globex, user=world.users["bob"], role=Role.VIEWER)
    acme_group, globex_group = f"o{world.acme.pk}.c{fleet.cluster.pk}", f"o{world.globex.pk}"
    bob_in_acme = Membership.objects.get(organization=world.acme, user=world.users["bob"])
    headers, api = _socket_headers(world, live_console, "bob"), Api(world, live_console, "alice", "carol", "charlie")

    async def scenario():
        async with _socket(live_console, headers) as bob:
            await bob.send(json.dumps({"subscribe": [acme_group, globex_group]}))
            assert (await _next(bob, "subscribed"))["groups"] == sorted([acme_group, globex_group])

            removed = await api("alice", "DELETE", f"members/{bob_in_acme.pk}/")
            assert removed.status_code == 204, removed.text
            changed = await _next(bob, "access_changed")
            assert changed == {"type": "access_changed", "groups": [globex_group], "dropped": [acme_group]}

            # An Acme change, then a Globex one: the first event bob hears is Globex's.
            drained = await api("carol", "POST", f"nodes/{fleet.node.pk}/drain/")
            assert drained.status_code == 200, drained.text
            created = await api("charlie", "POST", "clusters/",
                                              {"name": "globex-new"})
            assert created.status_code == 201, created.text
            heard = await _next(bob, "events")
            assert heard["group"] == globex_group, heard

    asyncio.run(scenario())


def test_a_role_change_rechecks_the_socket_and_a_user_left_with_no_organization_is_closed(world, live_console):
    fleet = make_fleet(world.acme)
    group = f"o{world.acme.pk}.c{fleet.cluster.pk}"
    carol = Membership.objects.get(organization=world.acme, user=world.users["carol"])
    headers, api = _socket_headers(world, live_console, "carol"), Api(world, live_console, "alice")

    async def scenario():
        async with _socket(live_console, headers) as ws:
            await ws.send(json.dumps({"subscribe": [group]}))
            assert (await _next(ws, "subscribed"))["groups"] == [group]

            demoted = await api("alice", "PATCH", f"members/{carol.pk}/",
                                              {"role": "viewer"})
            assert demoted.status_code == 200, demoted.text
            assert await _next(ws, "access_changed") == {"type": "access_changed", "groups": [group], "dropped": []}

            removed = await api("alice", "DELETE", f"members/{carol.pk}/")
            assert removed.status_code == 204, removed.text
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    message = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    assert message["type"] != "events", f"heard {message} after removal"
            assert closed.value.rcvd.code == 4403

    asyncio.run(scenario())
