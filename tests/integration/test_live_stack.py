"""End to end through real processes: uvicorn serving HTTP and websockets, a Celery worker."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import requests
import websockets
from django.test import Client

from console.commands import services as command_services
from console.commands.models import Command
from console.fleet.models import Node, NodeState
from tests.conftest import World, needs_redis
from tests.factories import make_fleet

pytestmark = pytest.mark.slow


@pytest.fixture
def world(transactional_db, django_user_model):
    return World(django_user_model)


def _session_cookie(world, name: str) -> str:
    client = Client()
    client.force_login(world.users[name])
    return client.cookies["sessionid"].value


def _api(world, name: str) -> dict:
    return {"Authorization": f"Bearer {world.token(name)}"}


def test_a_websocket_client_of_the_real_server_hears_a_change_made_through_the_api(world, live_console):
    fleet = make_fleet(world.acme)
    group = f"o{world.acme.pk}.c{fleet.cluster.pk}"
    ws_url = live_console.replace("http://", "ws://") + "/ws/live/"
    headers = {"Cookie": f"sessionid={_session_cookie(world, 'bob')}", "Origin": live_console}
    carol = _api(world, "carol")

    async def scenario():
        async with websockets.connect(ws_url, additional_headers=headers) as bob:
            await bob.send(json.dumps({"subscribe": [group]}))
            assert json.loads(await bob.recv()) == {"type": "subscribed", "groups": [group], "denied": []}
            response = await asyncio.to_thread(
                requests.post, f"{live_console}/api/v1/nodes/{fleet.node.pk}/drain/", headers=carol,
                timeout=10,
            )
            assert response.status_code == 200, response.text
            while True:
                message = json.loads(await asyncio.wait_for(bob.recv(), 10))
                states = [e["data"].get("state") for e in message["events"] if e["kind"] == "node"]
                if "draining" in states:
                    return message

    message = asyncio.run(scenario())
    assert message["group"] == group


def test_an_outsiders_websocket_is_denied_the_group(world, live_console):
    fleet = make_fleet(world.acme)
    group = f"o{world.acme.pk}.c{fleet.cluster.pk}"
    headers = {"Cookie": f"sessionid={_session_cookie(world, 'charlie')}", "Origin": live_console}

    async def scenario():
        async with websockets.connect(live_console.replace("http://", "ws://") + "/ws/live/",
                                      additional_headers=headers) as charlie:
            await charlie.send(json.dumps({"subscribe": [group]}))
            return json.loads(await charlie.recv())

    assert asyncio.run(scenario()) == {"type": "subscribed", "groups": [], "denied": [group]}


def _poll(base, credential, wait, out, key):
    started = time.monotonic()
    response = requests.get(f"{base}/api/v1/agent/commands", params={"wait": wait},
                            headers={"Authorization": f"Bearer {credential}"}, timeout=wait + 10)
    out[key] = (time.monotonic() - started, response.status_code, response.json())


def test_a_long_poll_returns_as_soon_as_a_command_is_queued(world, live_console):
    fleet = make_fleet(world.acme)
    command_services.claim(fleet.node.pk, 10)  # the fixture's command is out of the way
    out: dict = {}
    poller = threading.Thread(target=_poll, args=(live_console, fleet.credential, 25, out, "poll"))
    poller.start()
    time.sleep(1.0)  # let the poll settle into its wait
    response = requests.post(f"{live_console}/api/v1/nodes/{fleet.node.pk}/commands/",
                             json={"type": "inventory.refresh"}, headers=_api(world, "carol"), timeout=10)
    assert response.status_code == 201
    poller.join(30)
    elapsed, status, body = out["poll"]
    assert status == 200 and [c["id"] for c in body["commands"]] == [response.json()["id"]]
    assert elapsed < 10, f"the poll was not woken: it returned after {elapsed:.1f}s of a 25s wait"


def test_two_concurrent_long_polls_of_a_node_never_receive_the_same_command(world, live_console):
    fleet = make_fleet(world.acme)
    for i in range(60):
        command_services.issue_command(fleet.node, "node.health", idempotency_key=f"c{i}")
    seen: list[str] = []
    lock = threading.Lock()

    def drain():
        while True:
            response = requests.get(f"{live_console}/api/v1/agent/commands", params={"wait": 0, "max": 2},
                                    headers={"Authorization": f"Bearer {fleet.credential}"}, timeout=10)
            ids = [c["id"] for c in response.json()["commands"]]
            if not ids:
                return
            with lock:
                seen.extend(ids)

    threads = [threading.Thread(target=drain) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == len(set(seen)) == Command.objects.filter(node=fleet.node).count()


@needs_redis
def test_a_command_queued_in_another_process_wakes_the_poll_through_redis(world, live_console):
    fleet = make_fleet(world.acme)
    command_services.claim(fleet.node.pk, 10)
    out: dict = {}
    poller = threading.Thread(target=_poll, args=(live_console, fleet.credential, 25, out, "poll"))
    poller.start()
    time.sleep(1.0)
    command, _ = command_services.issue_command(fleet.node, "node.health")  # this test process, not the server
    poller.join(30)
    elapsed, _, body = out["poll"]
    assert [c["id"] for c in body["commands"]] == [str(command.pk)]
    assert elapsed < 4, f"woken only by the periodic re-check after {elapsed:.1f}s, not by Redis"


@needs_redis
def test_a_task_runs_in_a_real_celery_worker_through_redis(world, celery_worker_process):
    from datetime import timedelta

    from django.utils import timezone

    from console.fleet.tasks import sweep_lost_nodes

    fleet = make_fleet(world.acme)
    Node.objects.filter(pk=fleet.node.pk).update(state=NodeState.READY, last_seen=timezone.now() - timedelta(hours=1))
    result = sweep_lost_nodes.apply_async(ignore_result=False)
    assert result.get(timeout=30) == 1
    assert Node.objects.get(pk=fleet.node.pk).state == NodeState.LOST
    assert "console.fleet.tasks.sweep_lost_nodes" in celery_worker_process.output()
