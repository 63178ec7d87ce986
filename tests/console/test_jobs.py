"""The jobs app: what the agents forward (``event.job.heartbeat``, ``event.job.snapshot``,
``event.job.checkpoint``, ``event.weights.version``, ``event.nccl.failover``/``failback``) becomes
jobs, their snapshots and checkpoints, weight versions and path events, through the real
telemetry endpoint; the API and pages show them to the owner and a viewer of the organization,
and 404 to an outsider; a bad event is refused naming its field, and nothing is stored."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from console.core import scoping
from console.jobs.models import Job, JobCapture, PathEvent, WeightVersion
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db

TS = 1796403600.0


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def post(fleet, seq, records):
    return Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}").post(
        "/api/v1/agent/telemetry", json.dumps({"seq": seq, "records": records}), content_type="application/json")


def event(kind, data, ts=TS):
    return {"kind": f"event.{kind}", "ts": ts, "data": data}


def heartbeat(job="train-7", step=40, generation=0):
    return event("job.heartbeat", {"job": job, "generation": generation, "ranks": [
        {"rank": r, "step": step + (r == 0), "step_time_s": 0.01 * (r + 1), "node": 0, "state": "running"}
        for r in range(4)]})


SNAPSHOT = {"job": "train-7", "id": "20261201T120000-abc123", "step": 42, "bytes": 919116, "paused_s": 0.012,
            "duration_s": 1.5, "reason": "on demand", "undiscovered": [], "path": "/snap/train-7/20261201T120000-abc123",
            "ranks": 4}
CHECKPOINT = {"job": "train-7", "path": "/ckpt/step-50", "step": 50, "save_id": "s50", "world_size": 4,
              "bytes": 4096, "stall_s": 0.002, "duration_s": 0.3}
VERSION = {"job": "train-7", "publisher": "a" * 32, "version": 3, "bytes": 1 << 20, "duration_s": 0.2,
           "replicas": {"r0": "ok", "r1": "ok"},
           "holders": {"r0": {"received": 3, "applied": 3, "sending": None}, "r1": {"received": 3, "applied": 2}}}
FAILOVER = {"comm": "0x7f3a", "rank": 3, "from": "mlx5_0", "to": "mlx5_1"}


def everything(fleet):
    response = post(fleet, 20, [heartbeat(), event("job.snapshot", SNAPSHOT), event("job.checkpoint", CHECKPOINT),
                                event("weights.version", VERSION), event("nccl.failover", FAILOVER),
                                event("nccl.failback", dict(FAILOVER, **{"from": "mlx5_1", "to": "mlx5_0"}),
                                      ts=TS + 5)])
    assert response.status_code == 202, response.content


def test_forwarded_events_become_the_job_its_captures_versions_and_path_events(fleet, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        everything(fleet)
    with scoping.for_organization(fleet.node.organization_id):
        job = Job.objects.get(cluster=fleet.cluster, name="train-7")
        assert (job.node_id, job.world_size, job.step, job.generation) == (fleet.node.pk, 4, 40, 0)
        assert job.step_time_s == pytest.approx(0.04)
        snapshot = JobCapture.objects.get(job=job, kind="snapshot")
        assert (snapshot.identifier, snapshot.step, snapshot.bytes, snapshot.paused_s, snapshot.path) == (
            SNAPSHOT["id"], 42, 919116, 0.012, SNAPSHOT["path"])
        checkpoint = JobCapture.objects.get(job=job, kind="checkpoint")
        assert (checkpoint.identifier, checkpoint.step, checkpoint.paused_s) == ("s50", 50, 0.002)
        version = WeightVersion.objects.get(job=job)
        assert version.version == 3 and version.holders["r1"]["applied"] == 2
        assert [(e.kind, e.from_device, e.to_device) for e in PathEvent.objects.filter(node=fleet.node, comm="0x7f3a")] == [
            ("failback", "mlx5_1", "mlx5_0"), ("failover", "mlx5_0", "mlx5_1")]
    # A retried or repeated event adds nothing; an older heartbeat does not move the job back.
    with django_capture_on_commit_callbacks(execute=True):
        assert post(fleet, 21, [event("job.snapshot", SNAPSHOT), heartbeat(step=10) | {"ts": TS - 60}]).status_code == 202
    with scoping.for_organization(fleet.node.organization_id):
        assert JobCapture.objects.filter(kind="snapshot", job__name="train-7").count() == 1
        assert Job.objects.get(name="train-7").step == 40


def test_a_large_jobs_heartbeat_in_parts_becomes_one_job_and_an_older_part_is_ignored(
        fleet, django_capture_on_commit_callbacks):
    def part(first, count, step, ts):
        return event("job.heartbeat", {"job": "big", "generation": 2, "world_size": 1000, "ranks": [
            {"rank": r, "step": step + (r == 999), "step_time_s": 0.5 if r == 640 else 0.1, "node": r // 8,
             "state": "running"} for r in range(first, min(first + count, 1000))]}, ts=ts)

    parts = [part(first, 256, 70, TS + first * 1e-6) for first in range(0, 1000, 256)]
    with django_capture_on_commit_callbacks(execute=True):
        assert post(fleet, 30, parts[:2]).status_code == 202
        assert post(fleet, 31, parts[2:]).status_code == 202
    with scoping.for_organization(fleet.node.organization_id):
        job = Job.objects.get(cluster=fleet.cluster, name="big")
        assert [r["rank"] for r in job.ranks] == list(range(1000))
        assert (job.world_size, job.step, job.generation, job.step_time_s) == (1000, 70, 2, 0.5)
    # The next heartbeat moves the ranks of its part; a part of an earlier heartbeat does not.
    with django_capture_on_commit_callbacks(execute=True):
        assert post(fleet, 32, [part(0, 256, 90, TS + 5), part(256, 256, 20, TS - 5)]).status_code == 202
    with scoping.for_organization(fleet.node.organization_id):
        job = Job.objects.get(cluster=fleet.cluster, name="big")
        assert {r["step"] for r in job.ranks[:256]} == {90}
        assert {r["step"] for r in job.ranks[256:999]} == {70} and job.step == 70


def test_every_change_is_published_live_to_the_cluster(fleet, django_capture_on_commit_callbacks, monkeypatch):
    from console.live import publish as live

    sent = []
    monkeypatch.setattr(live.outbox, "put", lambda group, ev, prompt=False: sent.append((group, ev["kind"])))
    with django_capture_on_commit_callbacks(execute=True):
        everything(fleet)
    group = f"o{fleet.node.organization_id}.c{fleet.cluster.pk}"
    kinds = [kind for g, kind in sent if g == group]
    for kind in ("job", "job_capture", "weight_version", "path_event"):
        assert kind in kinds, sent


@pytest.mark.parametrize(("kind", "data", "field"), [
    ("job.heartbeat", {"ranks": []}, "records[0].data.job"),
    ("job.heartbeat", {"job": "j", "ranks": [{"rank": -1}]}, "records[0].data.ranks[0].rank"),
    ("job.snapshot", dict(SNAPSHOT, step="forty"), "records[0].data.step"),
    ("job.snapshot", dict(SNAPSHOT, job="x" * 65), "records[0].data.job"),
    ("job.checkpoint", dict(CHECKPOINT, bytes=-1), "records[0].data.bytes"),
    ("weights.version", dict(VERSION, replicas={"r0": 1}), "records[0].data.replicas.r0"),
    ("weights.version", dict(VERSION, holders={"r0": {"applied": "v3"}}), "records[0].data.holders.r0.applied"),
    ("nccl.failover", dict(FAILOVER, rank="three"), "records[0].data.rank"),
])
def test_a_bad_event_is_refused_naming_its_field_and_nothing_is_stored(fleet, kind, data, field,
                                                                       django_capture_on_commit_callbacks):
    with scoping.for_organization(fleet.node.organization_id):
        before = (Job.objects.count(), JobCapture.objects.count(), WeightVersion.objects.count(),
                  PathEvent.objects.count())
    with django_capture_on_commit_callbacks(execute=True):
        response = post(fleet, 30, [event(kind, data)])
    assert response.status_code == 400
    assert list(response.json()["fields"]) == [field], response.json()
    with scoping.for_organization(fleet.node.organization_id):
        assert before == (Job.objects.count(), JobCapture.objects.count(), WeightVersion.objects.count(),
                          PathEvent.objects.count())


@pytest.fixture
def reported(fleet, world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        everything(fleet)
    with scoping.for_organization(world.acme.pk):
        return Job.objects.get(name="train-7")


@pytest.mark.parametrize("name", ["alice", "bob"])
def test_owner_and_member_see_the_job_and_what_it_captured(world, fleet, reported, name):
    client = world.client(name)
    jobs = client.get("/api/v1/jobs/?name=train-7").json()["results"]
    assert [(j["name"], j["step"], j["world_size"]) for j in jobs] == [("train-7", 40, 4)]
    captures = client.get(f"/api/v1/job-captures/?job={reported.pk}").json()["results"]
    assert sorted(c["kind"] for c in captures) == ["checkpoint", "snapshot"]
    only = client.get(f"/api/v1/job-captures/?job={reported.pk}&kind=snapshot").json()["results"]
    assert [c["identifier"] for c in only] == [SNAPSHOT["id"]]
    versions = client.get(f"/api/v1/weight-versions/?job={reported.pk}").json()["results"]
    assert [v["version"] for v in versions] == [3]
    events = client.get(f"/api/v1/path-events/?node={fleet.node.pk}&comm=0x7f3a").json()["results"]
    assert [e["kind"] for e in events] == ["failback", "failover"]
    assert client.get(f"/api/v1/jobs/{reported.pk}/").json()["ranks"][1]["step"] == 40


def test_an_outsider_sees_nothing_and_gets_404(world, fleet, reported):
    client = world.client("charlie")
    assert client.get("/api/v1/jobs/").json()["results"] == []
    assert client.get("/api/v1/job-captures/").json()["results"] == []
    assert client.get("/api/v1/weight-versions/").json()["results"] == []
    assert client.get("/api/v1/path-events/").json()["results"] == []
    assert client.get(f"/api/v1/jobs/{reported.pk}/").status_code == 404
    assert client.get(f"/api/v1/job-captures/?job={reported.pk}").status_code == 400  # not a choice it can see
    web = Client()
    web.force_login(world.users["charlie"])
    assert web.get(f"/jobs/{reported.pk}/").status_code == 404
    assert web.get(f"/clusters/{fleet.cluster.pk}/jobs/").status_code == 404


def test_the_api_is_read_only(world, reported):
    client = world.client("alice")
    assert client.post("/api/v1/jobs/", {"name": "x"}, format="json").status_code == 405
    assert client.delete(f"/api/v1/jobs/{reported.pk}/").status_code == 405


@pytest.mark.parametrize("name", ["alice", "bob"])
def test_the_pages_show_the_job_its_snapshot_checkpoint_versions_and_path_events(world, fleet, reported, name):
    web = Client()
    web.force_login(world.users[name])
    html = web.get(f"/clusters/{fleet.cluster.pk}/jobs/").content.decode()
    assert f'href="/jobs/{reported.pk}/"' in html and "train-7" in html
    assert "mlx5_0" in html and "failover" in html and "failback" in html
    assert f'"o{world.acme.pk}.c{fleet.cluster.pk}"' in html  # the live group the page subscribes to
    html = web.get(f"/jobs/{reported.pk}/").content.decode()
    assert SNAPSHOT["id"] in html and SNAPSHOT["path"] in html and "/ckpt/step-50" in html
    assert 'data-version="3"' in html and "r1: v2" in html
