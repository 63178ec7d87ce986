"""Prometheus /metrics: nodes by state per organization, held polls, delivery latency,
telemetry rows and rejects; only for a token or an allow-listed network."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient, Client
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from console.commands import services as command_services
from console.core import scoping
from console.fleet import services as fleet_services
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


def scrape(client=None, **headers) -> dict:
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_are_refused_outside_the_allowed_networks_without_the_token(settings):
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    outside = {"REMOTE_ADDR": "198.51.100.7"}
    refused = Client().get("/metrics", **outside)
    assert refused.status_code == 403 and refused.json()["error"] == "permission_denied"
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **outside).status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token", **outside).status_code == 200
    assert Client().get("/metrics").status_code == 200  # loopback is allowed by default
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ", **outside).status_code == 403


def test_nodes_are_counted_by_organization_and_state(world):
    acme, globex = make_fleet(world.acme, "a"), make_fleet(world.globex, "g")
    fleet_services.mark_seen(acme.node)
    fleet_services.drain(globex.node)
    samples = scrape()

    def nodes(org, state):
        return samples[("lockstep_nodes", (("organization_id", str(org.pk)), ("state", state)))]

    assert (nodes(world.acme, "ready"), nodes(world.acme, "enrolling"), nodes(world.acme, "draining")) == (1, 1, 0)
    assert (nodes(world.globex, "draining"), nodes(world.globex, "ready")) == (1, 0)
    assert samples[("lockstep_organization_info", (("organization_id", str(world.acme.pk)), ("slug", "acme")))] == 1


def test_telemetry_rows_and_rejects_are_counted_per_organization(world):
    fleet = make_fleet(world.acme)
    org = str(world.acme.pk)
    before = scrape()
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}")
    records = [{"kind": "node.health", "ts": 1796403600, "data": {"load1": 1.0}}] * 3
    assert agent.post("/api/v1/agent/telemetry", json.dumps({"seq": 2, "records": records}),
                      content_type="application/json").status_code == 202
    agent.post("/api/v1/agent/telemetry", json.dumps({"seq": 3, "records": [{"kind": "x.y", "ts": 1, "data": {}}]}),
               content_type="application/json")
    Client(HTTP_AUTHORIZATION="Bearer lsn_nope").post("/api/v1/agent/telemetry", "{}", content_type="application/json")
    after = scrape()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("lockstep_telemetry_records_total", organization_id=org, kind="node.health") == 3
    assert delta("lockstep_telemetry_batches_total", organization_id=org, outcome="stored") == 1
    assert delta("lockstep_telemetry_rejects_total", organization_id=org, reason="unknown_kind") == 1
    assert delta("lockstep_telemetry_rejects_total", organization_id="", reason="unauthenticated") == 1


def test_the_first_delivery_of_a_command_is_timed(world):
    fleet = make_fleet(world.acme)
    count = REGISTRY.get_sample_value("lockstep_command_delivery_seconds_count") or 0
    with scoping.for_organization(world.acme.pk):
        command_services.claim(fleet.node.pk, 10)  # the fixture's command: a first delivery
    assert REGISTRY.get_sample_value("lockstep_command_delivery_seconds_count") == count + 1
    assert REGISTRY.get_sample_value("lockstep_command_delivery_seconds_bucket", {"le": "+Inf"}) == count + 1


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_long_poll_is_counted_while_it_is_held(world):
    fleet = await sync_to_async(make_fleet)(world.acme)
    client, auth = AsyncClient(), {"Authorization": f"Bearer {fleet.credential}"}
    first = await client.get("/api/v1/agent/commands", {"wait": 0}, headers=auth)  # takes the fixture's command
    assert first.status_code == 200 and len(first.json()["commands"]) == 1, first.content
    held = REGISTRY.get_sample_value("lockstep_agent_polls_held")
    poll = asyncio.ensure_future(client.get("/api/v1/agent/commands", {"wait": 3}, headers=auth))
    for _ in range(100):
        if REGISTRY.get_sample_value("lockstep_agent_polls_held") == held + 1:
            break
        await asyncio.sleep(0.02)
    assert REGISTRY.get_sample_value("lockstep_agent_polls_held") == held + 1
    assert (await poll).json() == {"commands": []}
    assert REGISTRY.get_sample_value("lockstep_agent_polls_held") == held
    await sync_to_async(connections.close_all)()
