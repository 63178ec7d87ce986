"""Commands: issue, claim (once), lease and redelivery, results accepted once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from console.commands import services as command_services
from console.commands.models import Command, CommandState
from console.core import scoping
from tests.conftest import needs_postgres
from tests.factories import make_fleet


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def _agent(fleet) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}")


def _result(fleet, command_id, status="succeeded", result=None, error=""):
    return _agent(fleet).post(f"/api/v1/agent/commands/{command_id}/result",
                              {"status": status, "result": result, "error": error}, content_type="application/json")


@pytest.mark.django_db
def test_a_poll_claims_pending_commands_oldest_first_and_leases_them(fleet):
    second, _ = command_services.issue_command(fleet.node, "inventory.refresh")
    response = _agent(fleet).get("/api/v1/agent/commands?wait=0")
    assert response.status_code == 200
    ids = [c["id"] for c in response.json()["commands"]]
    assert ids == [str(fleet.command.pk), str(second.pk)]
    assert response.json()["commands"][0] == {
        "id": str(fleet.command.pk), "type": "node.health", "args": {}, "timeout_s": 30, "attempt": 1,
        "issued_at": fleet.command.created.isoformat(),
    }
    assert set(Command.objects.values_list("state", flat=True)) == {CommandState.DELIVERED}
    assert _agent(fleet).get("/api/v1/agent/commands?wait=0").json() == {"commands": []}


@pytest.mark.django_db
def test_a_result_is_accepted_once(fleet):
    command_services.claim(fleet.node.pk, 10)
    first = _result(fleet, fleet.command.pk, result={"load1": 0.5, "ok": True})
    assert first.json() == {"accepted": True}
    again = _result(fleet, fleet.command.pk, status="failed", error="late duplicate")
    assert again.status_code == 200 and again.json() == {"accepted": False, "reason": "already completed"}
    command = Command.objects.get(pk=fleet.command.pk)
    assert command.state == CommandState.SUCCEEDED and command.result == {"load1": 0.5, "ok": True}
    fleet.node.refresh_from_db()
    assert fleet.node.health_report == {"load1": 0.5, "ok": True}  # the node.health hook applied it


@pytest.mark.django_db
def test_a_command_of_another_node_answers_404(world, fleet):
    other = make_fleet(world.globex)
    response = _result(other, fleet.command.pk)
    assert response.status_code == 404
    assert Command.objects.get(pk=fleet.command.pk).state == CommandState.PENDING


@pytest.mark.django_db
def test_a_bad_result_status_is_named(fleet):
    response = _result(fleet, fleet.command.pk, status="done")
    assert response.status_code == 400 and "status" in response.json()["fields"]


@pytest.mark.django_db
def test_an_expired_lease_redelivers_the_command_then_gives_up(fleet):
    for attempt in (1, 2, 3):
        claimed = command_services.claim(fleet.node.pk, 10)
        assert [c.pk for c in claimed] == [fleet.command.pk]
        assert claimed[0].attempt == attempt
        Command.objects.filter(pk=fleet.command.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))
    assert command_services.requeue_expired() == 1
    command = Command.objects.get(pk=fleet.command.pk)
    assert command.state == CommandState.EXPIRED
    assert command.error == "no result after 3 deliveries"
    assert command_services.claim(fleet.node.pk, 10) == []


@pytest.mark.django_db
def test_a_late_result_after_expiry_is_still_recorded(fleet):
    command_services.claim(fleet.node.pk, 10)
    Command.objects.filter(pk=fleet.command.pk).update(state=CommandState.EXPIRED)
    assert _result(fleet, fleet.command.pk, result={"ok": True}).json() == {"accepted": True}


@pytest.mark.django_db
def test_operators_queue_commands_idempotently_through_the_api(world, fleet):
    client = world.client("carol")
    body = {"node": fleet.node.pk, "type": "inventory.refresh", "idempotency_key": "refresh-1"}
    first = client.post("/api/v1/commands/", body, format="json")
    again = client.post("/api/v1/commands/", body, format="json")
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert Command.objects.filter(idempotency_key="refresh-1").count() == 1


@pytest.mark.django_db
def test_unknown_types_and_bad_arguments_are_refused_with_their_names(world, fleet):
    client = world.client("carol")
    unknown = client.post("/api/v1/commands/", {"node": fleet.node.pk, "type": "reboot.everything"}, format="json")
    assert unknown.status_code == 400
    assert "unknown command type 'reboot.everything'" in unknown.json()["fields"]["type"]
    bad_args = client.post(f"/api/v1/nodes/{fleet.node.pk}/commands/",
                           {"type": "node.health", "args": {"verbose": True}}, format="json")
    assert bad_args.status_code == 400
    assert "args.verbose" in bad_args.json()["fields"]
    assert Command.objects.count() == 1


@pytest.mark.django_db
def test_a_pending_command_can_be_cancelled_and_is_then_never_delivered(world, fleet):
    response = world.client("carol").post(f"/api/v1/commands/{fleet.command.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert command_services.claim(fleet.node.pk, 10) == []
    assert _result(fleet, fleet.command.pk).json() == {"accepted": False, "reason": "cancelled"}


@pytest.mark.django_db
def test_the_inventory_refresh_result_replaces_the_inventory(fleet):
    from tests.factories import inventory_doc

    command, _ = command_services.issue_command(fleet.node, "inventory.refresh")
    command_services.claim(fleet.node.pk, 10)
    _result(fleet, command.pk, result=inventory_doc(fleet.node.name, fleet.node.machine_id, gpus=4))
    assert fleet.node.gpus.count() == 4


@pytest.mark.django_db
def test_a_malformed_inventory_result_fails_the_command_with_the_reason(fleet):
    command, _ = command_services.issue_command(fleet.node, "inventory.refresh")
    command_services.claim(fleet.node.pk, 10)
    assert _result(fleet, command.pk, result={"format": "something else"}).json() == {"accepted": True}
    command.refresh_from_db()
    assert command.state == CommandState.FAILED
    assert "result rejected by the console: format" in command.error
    assert fleet.node.gpus.count() == 1  # the old inventory stays


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_pollers_on_postgresql_never_receive_the_same_command(world):
    fleet = make_fleet(world.acme)
    for i in range(199):
        command_services.issue_command(fleet.node, "node.health", idempotency_key=f"k{i}")
    received: list[list] = [[], []]
    barrier = threading.Barrier(2)

    def poller(slot: int) -> None:  # a thread of its own starts with no tenant scope, like a poll
        try:
            barrier.wait()
            while True:
                with scoping.for_organization(fleet.node.organization_id):
                    claimed = command_services.claim(fleet.node.pk, 3)
                if not claimed:
                    return
                received[slot].extend(c.pk for c in claimed)
        finally:
            connection.close()

    threads = [threading.Thread(target=poller, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    first, second = set(received[0]), set(received[1])
    assert len(received[0]) == len(first) and len(received[1]) == len(second)
    assert not first & second, "a command was delivered to both pollers"
    assert first | second == set(Command.objects.values_list("pk", flat=True))
    assert first and second, "both pollers should have claimed some commands"
