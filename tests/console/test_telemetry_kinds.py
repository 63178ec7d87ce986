"""Telemetry kinds: each registered with a validator that names the bad field, handlers run after
the batch is stored, unknown kinds refused by name."""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import REGISTRY

from console.core import scoping
from console.fleet.models import Node
from console.telemetry import kinds
from console.telemetry.builtin import EVENT_KINDS
from console.telemetry.models import TelemetryBatch, TelemetryRecord
from tests.conftest import TEST_KIND
from tests.factories import make_fleet

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("test_telemetry_kind")]


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def post(fleet, seq, records):
    return Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}").post(
        "/api/v1/agent/telemetry", json.dumps({"seq": seq, "records": records}), content_type="application/json")


def record(kind=TEST_KIND, data=None, ts=1796403600.0):
    return {"kind": kind, "ts": ts, "data": {"i": 1} if data is None else data}


def rejects(organization_id, reason) -> float:
    return REGISTRY.get_sample_value("lockstep_telemetry_rejects_total",
                                     {"organization_id": str(organization_id), "reason": reason}) or 0.0


def test_an_unknown_kind_is_refused_by_name_and_nothing_of_the_batch_is_stored(fleet):
    before = rejects(fleet.node.organization_id, "unknown_kind")
    response = post(fleet, 5, [record(), record(kind="probe.windoww")])
    assert response.status_code == 400
    problem = response.json()["fields"]["records[1].kind"]
    assert "unknown telemetry kind 'probe.windoww'" in problem and "node.health" in problem
    assert not TelemetryBatch.objects.filter(node=fleet.node, seq=5).exists()
    assert rejects(fleet.node.organization_id, "unknown_kind") == before + 1


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"load1": "high"}, "records[0].data.load1"),
        ({"gpus": [{"index": 0}, {"index": -1}]}, "records[0].data.gpus[1].index"),
        ({"problems": ["fine", 3]}, "records[0].data.problems[1]"),
        ({"ok": "yes"}, "records[0].data.ok"),
    ],
)
def test_a_validator_names_the_field_inside_the_data(fleet, data, field):
    response = post(fleet, 6, [record("node.health", data)])
    assert response.status_code == 400
    assert list(response.json()["fields"]) == [field], response.json()


@pytest.mark.parametrize("kind", [f"event.{k}" for k in EVENT_KINDS])
def test_every_forwarded_event_kind_of_the_local_socket_contract_is_accepted(fleet, kind):
    response = post(fleet, 7, [record(kind, {"ts_ns": 1796403600123456789, "job": "train-7", "rank": 3,
                                             "detail": {"nic": "mlx5_1", "state": "down"}})])
    assert response.status_code == 202, response.content
    assert TelemetryRecord.objects.get(node=fleet.node, kind=kind).data["detail"] == {"nic": "mlx5_1", "state": "down"}


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}, "records[0].data.a.b.c.d.e", "deeper"),
        ({"blob": "x" * 2000}, "records[0].data.blob", "characters"),
        ({f"k{i}": i for i in range(65)}, "records[0].data", "keys"),
        ({"list": list(range(129))}, "records[0].data.list", "items"),
        ({"text": "a\x00b"}, "records[0].data.text", "NUL"),
        ({"big": 2**64}, "records[0].data.big", "64 bits"),
        ({f"k{i}": "y" * 1000 for i in range(10)}, "records[0].data", "bytes"),
    ],
)
def test_a_forwarded_event_is_bounded(fleet, data, field, problem):
    response = post(fleet, 8, [record("event.nccl.failover", data)])
    assert response.status_code == 400
    assert problem in response.json()["fields"][field], response.json()
    assert not TelemetryRecord.objects.filter(node=fleet.node, kind="event.nccl.failover").exists()


def test_a_not_a_number_is_refused_not_stored():
    with pytest.raises(kinds.KindInvalid, match="finite"):
        kinds.get("event.job.heartbeat").validate({"loss": float("nan")})


def test_handlers_run_once_after_the_batch_is_committed_in_the_nodes_organization(
        fleet, test_telemetry_kind, django_capture_on_commit_callbacks):
    seen = []
    test_telemetry_kind.handlers.append(lambda stored: seen.append((stored, scoping.active())))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert post(fleet, 9, [record(), record(kind="node.health", data={}), record()]).status_code == 202
        assert seen == []  # not before the commit
    for callback in callbacks:
        callback()
    [(stored, scope)] = seen
    assert stored.kind == TEST_KIND and stored.seq == 9 and stored.node_id == fleet.node.pk
    assert [r.data for r in stored.records] == [{"i": 1}, {"i": 1}]
    assert {r.id for r in stored.records} == set(
        TelemetryRecord.objects.filter(batch__seq=9, kind=TEST_KIND).values_list("id", flat=True))
    assert scope.organization_ids == {fleet.node.organization_id}
    with django_capture_on_commit_callbacks(execute=True):
        assert post(fleet, 9, [record()]).json() == {"accepted": 0, "duplicate": True}
    assert len(seen) == 1  # a retried batch is not handled twice


def test_a_failing_handler_is_counted_and_the_batch_and_other_handlers_are_not_affected(
        fleet, test_telemetry_kind, django_capture_on_commit_callbacks):
    ran = []

    def broken(stored):
        raise RuntimeError("handler bug")

    test_telemetry_kind.handlers.extend([broken, lambda stored: ran.append(stored.seq)])
    before = REGISTRY.get_sample_value("lockstep_telemetry_handler_errors_total", {"kind": TEST_KIND}) or 0
    with django_capture_on_commit_callbacks(execute=True):
        assert post(fleet, 10, [record()]).status_code == 202
    assert ran == [10] and TelemetryBatch.objects.filter(node=fleet.node, seq=10).exists()
    assert REGISTRY.get_sample_value("lockstep_telemetry_handler_errors_total", {"kind": TEST_KIND}) == before + 1


def test_the_newest_node_health_record_becomes_the_nodes_health_report(fleet, django_capture_on_commit_callbacks):
    now = timezone.now().timestamp()
    with django_capture_on_commit_callbacks(execute=True):
        response = post(fleet, 11, [record("node.health", {"load1": 0.5, "ok": True, "problems": []}, ts=now - 30),
                                    record("node.health", {"load1": 9.5, "ok": False, "problems": ["GPU 3 is hot"]},
                                           ts=now)])
    assert response.status_code == 202
    node = Node.objects.get(pk=fleet.node.pk)
    assert node.health_report["problems"] == ["GPU 3 is hot"] and abs(node.health_report_at.timestamp() - now) < 1
    with django_capture_on_commit_callbacks(execute=True):  # an older report arriving late does not replace it
        post(fleet, 12, [record("node.health", {"load1": 0.1, "ok": True, "problems": []}, ts=now - 300)])
    assert Node.objects.get(pk=fleet.node.pk).health_report["load1"] == 9.5


def test_a_feature_replaces_a_generic_event_kind_keeping_its_handlers(monkeypatch):
    monkeypatch.setattr(kinds, "_kinds", {name: dataclasses.replace(kind, handlers=list(kind.handlers))
                                          for name, kind in kinds._kinds.items()})
    attached = kinds.handler("event.job.rank_lost")(lambda stored: None)
    strict = kinds.register(kinds.TelemetryKind(
        "event.job.rank_lost", "A rank of a job was lost.",
        validate=kinds.shape({"job": kinds.text(64), "rank": kinds.integer(0)}, required=("job", "rank")),
    ))
    assert kinds.get("event.job.rank_lost") is strict and attached in strict.handlers
    with pytest.raises(kinds.KindInvalid, match="required"):
        strict.validate({"job": "j-1"})
    with pytest.raises(ValueError, match="already registered"):
        kinds.register(kinds.TelemetryKind("event.job.rank_lost", "again", validate=kinds.shape({})))
    with pytest.raises(kinds.UnknownKind):
        kinds.handler("no.such.kind")


@pytest.mark.parametrize(("value", "problem"), [("a\x00b", "NUL"), ("a\ud800b", "unpaired surrogate")])
def test_kind_text_is_refused_when_it_cannot_be_stored_as_the_columns_refuse_it(value, problem):
    with pytest.raises(kinds.KindInvalid, match=problem):
        kinds.text(64)(value, "data.name")
    with pytest.raises(kinds.KindInvalid, match=problem):
        kinds.bounded()({"name": value}, "data")
