from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.fleet import services as fleet_services
from console.fleet.models import Node, NodeState
from console.fleet.tasks import sweep_lost_nodes
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(world):
    fleet = make_fleet(world.acme)
    fleet_services.mark_seen(fleet.node)
    return fleet


def test_contact_makes_an_enrolling_node_ready(world):
    fleet = make_fleet(world.acme)
    assert fleet.node.state == NodeState.ENROLLING
    fleet_services.mark_seen(fleet.node)
    assert Node.objects.get(pk=fleet.node.pk).state == NodeState.READY


def test_a_silent_node_is_swept_to_lost_and_contact_brings_it_back(fleet, settings):
    Node.objects.filter(pk=fleet.node.pk).update(last_seen=timezone.now() - timedelta(seconds=91))
    assert sweep_lost_nodes.apply().get() == 1  # run here; the real worker is tested in integration
    node = Node.objects.get(pk=fleet.node.pk)
    assert node.state == NodeState.LOST
    assert sweep_lost_nodes() == 0  # idempotent
    Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}").post("/api/v1/agent/heartbeat", "{}",
                                                                  content_type="application/json")
    assert Node.objects.get(pk=fleet.node.pk).state == NodeState.READY


def test_a_recently_seen_node_is_not_swept(fleet):
    assert fleet_services.sweep_lost() == 0
    assert Node.objects.get(pk=fleet.node.pk).state == NodeState.READY


def test_drain_undrain_and_retire_through_the_api(world, fleet):
    client = world.client("carol")
    base = f"/api/v1/nodes/{fleet.node.pk}"
    assert client.post(f"{base}/drain/").json()["state"] == "draining"
    assert client.post(f"{base}/drain/").status_code == 409  # already draining
    assert client.post(f"{base}/undrain/").json()["state"] == "ready"
    retired = client.post(f"{base}/retire/")
    assert retired.json()["state"] == "retired"
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}")
    assert agent.post("/api/v1/agent/heartbeat", "{}", content_type="application/json").status_code == 401
    undrain = client.post(f"{base}/undrain/")
    assert undrain.status_code == 409 and "Only a draining node" in undrain.json()["fields"]["state"]


def test_a_draining_node_stays_draining_when_its_agent_talks(fleet):
    fleet_services.drain(fleet.node)
    fleet_services.mark_seen(Node.objects.get(pk=fleet.node.pk), now=timezone.now() + timedelta(seconds=30))
    assert Node.objects.get(pk=fleet.node.pk).state == NodeState.DRAINING
