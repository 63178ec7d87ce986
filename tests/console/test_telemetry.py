"""Telemetry batches: stored once per (node, seq), bounded, and all-or-nothing."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import AsyncClient, Client

from api.agent import views
from console.core import scoping
from console.core.asyncdb import FairSlots
from console.fleet.models import Node
from console.telemetry import kinds
from console.telemetry import services as telemetry_store
from console.telemetry.models import TelemetryBatch, TelemetryRecord
from tests.conftest import TEST_KIND, needs_postgres
from tests.factories import make_fleet

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("test_telemetry_kind")]


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def _post(fleet, body, raw: bytes | None = None):
    data = raw if raw is not None else json.dumps(body)
    return Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}").post(
        "/api/v1/agent/telemetry", data, content_type="application/json"
    )


def _records(n, kind=TEST_KIND):
    return [{"kind": kind, "ts": 1796403600.0 + i, "data": {"i": i}} for i in range(n)]


def test_a_batch_is_stored_and_a_retry_of_it_is_not(fleet):
    first = _post(fleet, {"seq": 2, "records": _records(3), "dropped": 4})
    assert first.status_code == 202 and first.json() == {"accepted": 3}
    retry = _post(fleet, {"seq": 2, "records": _records(3), "dropped": 4})
    assert retry.status_code == 200 and retry.json() == {"accepted": 0, "duplicate": True}
    assert TelemetryRecord.objects.filter(node=fleet.node, kind=TEST_KIND).count() == 3
    node = Node.objects.get(pk=fleet.node.pk)
    assert node.telemetry_dropped == 4 and node.telemetry_seq == 2


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_the_same_batch_sent_twice_at_once_is_stored_once(world):
    fleet = make_fleet(world.acme)
    barrier = threading.Barrier(2)
    results: list = []

    def send() -> None:  # a request's database thread: its own connection and scope
        try:
            barrier.wait()
            with scoping.for_organization(fleet.node.organization_id):
                results.append(telemetry_store.ingest(fleet.node, {"seq": 7, "records": _records(5)}, 100))
        except Exception as exc:  # the test's assertion names it
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted((r.accepted, r.duplicate) for r in results) == [(0, True), (5, False)], results
    assert TelemetryBatch.objects.filter(node=fleet.node, seq=7).count() == 1
    assert TelemetryRecord.objects.filter(node=fleet.node, kind=TEST_KIND).count() == 5


def test_an_oversize_body_is_refused_with_413_and_nothing_stored(fleet, settings):
    settings.LOCKSTEP = {**settings.LOCKSTEP, "TELEMETRY_MAX_BATCH_BYTES": 2000}
    before = TelemetryRecord.objects.count()
    response = _post(fleet, {"seq": 5, "records": _records(50)})
    assert response.status_code == 413 and response.json()["error"] == "batch_too_large"
    assert "limit is 2000" in response.json()["detail"]
    assert TelemetryRecord.objects.count() == before
    assert not TelemetryBatch.objects.filter(seq=5).exists()


def test_too_many_records_are_refused_with_413(fleet, settings):
    settings.LOCKSTEP = {**settings.LOCKSTEP, "TELEMETRY_MAX_RECORDS": 10}
    response = _post(fleet, {"seq": 5, "records": _records(11)})
    assert response.status_code == 413
    assert not TelemetryBatch.objects.filter(seq=5).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"records": []}, "seq"),
        ({"seq": 0, "records": []}, "seq"),
        ({"seq": 5, "records": {}}, "records"),
        ({"seq": 5, "records": [{"kind": "Bad Kind", "ts": 1.0, "data": {}}]}, "records[0].kind"),
        ({"seq": 5, "records": [*_records(2), {"kind": TEST_KIND, "ts": "yesterday", "data": {}}]}, "records[2].ts"),
        ({"seq": 5, "records": [*_records(1), {"kind": TEST_KIND, "ts": "2026-02-30T00:00:00Z", "data": {}}]},
         "records[1].ts"),
        ({"seq": 5, "records": [{"kind": TEST_KIND, "ts": 1796403600, "data": [1, 2]}]}, "records[0].data"),
        ({"seq": 5, "records": [*_records(1), {"kind": "no.such.kind", "ts": 1796403600, "data": {}}]},
         "records[1].kind"),
        ({"seq": 2**63, "records": []}, "seq"),
        ({"seq": 5, "dropped": -1, "records": []}, "dropped"),
    ],
)
def test_a_malformed_batch_names_the_bad_field_and_stores_nothing(fleet, body, field):
    before = TelemetryRecord.objects.count()
    response = _post(fleet, body)
    assert response.status_code == 400
    assert list(response.json()["fields"]) == [field]
    assert TelemetryRecord.objects.count() == before
    assert not TelemetryBatch.objects.filter(seq=5).exists()


def test_a_record_longer_than_its_kind_allows_is_refused_by_name_and_nothing_stored(fleet, monkeypatch):
    monkeypatch.setattr(kinds.get(TEST_KIND), "max_bytes", 64)
    body = {"seq": 5, "records": [*_records(2), {"kind": TEST_KIND, "ts": 1796403600, "data": {"x": "y" * 80}}]}
    response = _post(fleet, body)
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["records[2].data"]
    assert "bytes as JSON; at most 64" in response.json()["detail"]
    assert not TelemetryBatch.objects.filter(seq=5).exists()
    assert not TelemetryRecord.objects.filter(node=fleet.node, kind=TEST_KIND).exists()
    # data no JSON can hold, from a caller of ingest other than the endpoint, past a lenient validator
    monkeypatch.setattr(kinds.get(TEST_KIND), "validate", lambda data: data)
    with scoping.for_organization(fleet.node.organization_id), pytest.raises(
            telemetry_store.BatchInvalid, match=r"records\[0\].data: holds a number that is not finite"):
        telemetry_store.ingest(fleet.node, {"seq": 6, "records": [
            {"kind": TEST_KIND, "ts": 1796403600, "data": {"x": float("nan")}}]}, 100)
    assert not TelemetryBatch.objects.filter(seq=6).exists()


def test_a_record_holding_null_or_text_beyond_ascii_is_stored_as_sent(fleet, monkeypatch):
    monkeypatch.setattr(kinds.get(TEST_KIND), "validate", lambda data: data)
    data = [{"x": None}, {"s": "µs – ok"}, {"x": [None, 1.5]}]
    response = _post(fleet, {"seq": 7, "records": [{"kind": TEST_KIND, "ts": 1796403600, "data": d} for d in data]})
    assert response.status_code == 202, response.json()
    stored = TelemetryRecord.objects.filter(node=fleet.node, kind=TEST_KIND).order_by("id")
    assert [r.data for r in stored] == data


def test_a_body_that_is_not_json_is_refused(fleet):
    response = _post(fleet, None, raw=b"{not json")
    assert response.status_code == 400 and "not JSON" in response.json()["detail"]


def test_telemetry_needs_a_node_credential(fleet):
    response = Client().post("/api/v1/agent/telemetry", "{}", content_type="application/json")
    assert response.status_code == 401 and response.json()["error"] == "node_credential_invalid"


def test_tenants_read_their_telemetry_filtered_by_kind(world, fleet):
    _post(fleet, {"seq": 9, "records": _records(3, kind="node.health") + _records(2)})
    rows = world.client("bob").get("/api/v1/telemetry/", {"kind": TEST_KIND}).json()["results"]
    assert len(rows) == 2 and {r["seq"] for r in rows} == {9}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_batch_waits_for_a_telemetry_slot_and_is_stored_once_one_frees(world, monkeypatch):
    fleet = await sync_to_async(make_fleet)(world.acme)
    slots = FairSlots(1)
    monkeypatch.setattr(views, "TELEMETRY_SLOTS", slots)
    client = AsyncClient()
    body = json.dumps({"seq": 7, "records": _records(2)})
    async with slots.within(world.globex.pk, 10):  # another organization's batch is being stored
        request = asyncio.ensure_future(client.post(
            "/api/v1/agent/telemetry", body, content_type="application/json",
            headers={"Authorization": f"Bearer {fleet.credential}"},
        ))
        done, _ = await asyncio.wait([request], timeout=0.5)
        assert not done, "the batch was stored while every telemetry slot was taken"
        assert not await sync_to_async(TelemetryBatch.objects.filter(node=fleet.node, seq=7).exists)()
    response = await asyncio.wait_for(request, 10)
    assert response.status_code == 202 and response.json() == {"accepted": 2}, response.content
    assert await sync_to_async(TelemetryRecord.objects.filter(batch__node=fleet.node, batch__seq=7).count)() == 2
    await sync_to_async(connections.close_all)()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_batch_that_waits_too_long_for_a_slot_is_answered_503_and_not_stored(world, monkeypatch, settings):
    settings.LOCKSTEP = {**settings.LOCKSTEP, "TELEMETRY_QUEUE_WAIT_S": 0}
    fleet = await sync_to_async(make_fleet)(world.acme)
    slots = FairSlots(1)
    monkeypatch.setattr(views, "TELEMETRY_SLOTS", slots)
    async with slots.within(world.globex.pk, 10):
        response = await AsyncClient().post(
            "/api/v1/agent/telemetry", json.dumps({"seq": 8, "records": _records(2)}),
            content_type="application/json", headers={"Authorization": f"Bearer {fleet.credential}"},
        )
    assert response.status_code == 503 and response.json()["error"] == "busy"
    assert response.headers["Retry-After"] == str(views.TELEMETRY_RETRY_AFTER_S)
    assert not await sync_to_async(TelemetryBatch.objects.filter(node=fleet.node, seq=8).exists)()
    await sync_to_async(connections.close_all)()
