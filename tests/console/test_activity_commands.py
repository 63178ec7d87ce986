"""`activity.set` on the console: what operators may send, named when wrong; the heartbeat's
activity health stored on the node."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from console.commands import services as command_services
from console.commands.models import Command
from tests.factories import make_fleet


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def _queue(world, fleet, args, user="carol"):
    return world.client(user).post(f"/api/v1/nodes/{fleet.node.pk}/commands/",
                                   {"type": "activity.set", "args": args}, format="json")


@pytest.mark.django_db
def test_an_operator_starts_an_activity_and_the_console_stamps_a_revision(world, fleet):
    before = time.time_ns()
    response = _queue(world, fleet, {"name": "example.loop", "args": {"peers": ["node1/nic0"], "interval_s": 0.5}})
    assert response.status_code == 201, response.json()
    command = Command.objects.get(pk=response.json()["id"])
    assert command.type == "activity.set" and command.timeout_s == 30
    assert command.args["name"] == "example.loop" and command.args["state"] == "running"
    assert command.args["args"] == {"peers": ["node1/nic0"], "interval_s": 0.5}
    assert before <= command.args["revision"] <= time.time_ns()
    later, _ = command_services.issue_command(fleet.node, "activity.set", {"name": "example.loop", "state": "stopped"})
    assert later.args["revision"] > command.args["revision"]  # issued later: it wins on the agent
    kept, _ = command_services.issue_command(fleet.node, "activity.set", {"name": "clock.sync", "revision": 12})
    assert kept.args == {"name": "clock.sync", "state": "running", "revision": 12}


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "field", "message"), [
    ({}, "name", "required"),
    ({"name": "Probe Mesh"}, "name", "dotted lowercase activity name"),
    ({"name": "probemesh"}, "name", "dotted lowercase activity name"),
    ({"name": "agent.heartbeat", "state": "stopped"}, "name", "the agent's own flows"),
    ({"name": "probe.mesh", "state": "paused"}, "state", "not a valid choice"),
    ({"name": "probe.mesh", "args": [1, 2]}, "args", "must be an object"),
    ({"name": "example.loop", "args": {"peers": ["x" * 100] * 200}}, "args", "larger than 16384 bytes"),
    ({"name": "probe.mesh", "state": "stopped", "args": {"peers": []}}, "args", "a stopped activity takes no plan"),
    ({"name": "probe.mesh", "revision": -1}, "revision", "greater than or equal to 0"),
    ({"name": "probe.mesh", "colour": "red"}, "colour", "unknown argument"),
])
def test_bad_activity_commands_are_refused_naming_the_field(world, fleet, args, field, message):
    count = Command.objects.count()
    response = _queue(world, fleet, args)
    assert response.status_code == 400, response.json()
    assert message in str(response.json()["fields"]["args." + field])
    assert Command.objects.count() == count


@pytest.mark.django_db
def test_viewers_and_outsiders_cannot_queue_activity_commands(world, fleet):
    assert _queue(world, fleet, {"name": "probe.mesh"}, user="bob").status_code == 403
    assert _queue(world, fleet, {"name": "probe.mesh"}, user="charlie").status_code == 404


@pytest.mark.django_db
def test_the_heartbeat_stores_the_agents_activity_health(fleet):
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}")
    activities = [{"name": "agent.heartbeat", "state": "running", "desired": "running", "restarts": 0},
                  {"name": "probe.mesh", "state": "backoff", "desired": "running", "restarts": 3,
                   "last_error": "OSError: no route", "retry_in_s": 4.2},
                  "not an entry", {"state": "nameless"}]
    response = agent.post("/api/v1/agent/heartbeat", {"uptime_s": 5, "activities": activities},
                          content_type="application/json")
    assert response.status_code == 200
    fleet.node.refresh_from_db()
    assert fleet.node.agent_status["activities"] == activities[:2]
    assert fleet.node.agent_status["uptime_s"] == 5
