"""Clock sync on the console: start plans the probe graph and starts the agents' clock.sync;
clock.estimate records are validated by field and kept per pair; the network solve stores each
node's offset, drift and bound, flags what the loops contradict, detects a clock step and sends
corrections; the API shows it to members and hides it from outsiders; the metric has the bound."""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from console.celery import app as celery_app
from console.clocks import services
from console.clocks.models import ClockState, ClockSync, NodeClock, PairEstimate
from console.commands.models import Command
from console.fleet import services as fleet_services
from console.fleet.models import Cluster
from tests.factories import inventory_doc, make_enrollment_token

pytestmark = pytest.mark.django_db
T0 = 1_796_403_600_000_000_000
# node clock − reference (node0) clock at T0, and drift (ppm)
TRUTH = {"c-node0": (0.0, 0.0), "c-node1": (5_000_000.0, 12.0), "c-node2": (-3_000_000.0, -7.5)}


@pytest.fixture
def eager_tasks():
    """The solve task runs in the test (with Redis it would go to a worker this test has not started)."""
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = before


def topology(hosts):
    return {"format": "lockstep.topology/v1", "name": "clock-fabric", "hosts": [{"name": h} for h in hosts],
            "switches": [{"name": "leaf-0", "tier": "leaf"}],
            "nics": [{"name": f"{h}/nic0", "host": h, "rail": 0} for h in hosts],
            "links": [{"id": f"{h}/nic0~leaf-0", "a": f"{h}/nic0", "b": "leaf-0"} for h in hosts]}


@pytest.fixture
def cluster(world):
    cluster = Cluster.objects.create(organization=world.acme, name="clock-cluster")
    fleet_services.import_topology(cluster, topology(sorted(TRUTH)))
    token = make_enrollment_token(cluster, max_uses=10)
    credentials = {}
    for i, host in enumerate(sorted(TRUTH)):
        enrolled = fleet_services.enroll(token, {"hostname": host, "machine_id": f"clock-m{i}"})
        doc = inventory_doc(host, f"clock-m{i}")
        doc["nics"][0]["addresses"] = [f"10.9.0.{i + 1}/24", "fe80::1/64"]
        fleet_services.apply_inventory(enrolled.node, doc)
        fleet_services.mark_seen(enrolled.node)
        credentials[host] = enrolled.credential
    cluster.credentials = credentials
    return cluster


def plans(cluster) -> dict[str, dict]:
    out = {}
    for c in Command.objects.filter(cluster=cluster, type="activity.set").order_by("created"):
        out[c.node.name] = c.args
    return out


def true_offset(host: str, at_ref_ns: int) -> float:
    off, drift = TRUTH[host]
    return off + drift * 1e-6 * (at_ref_ns - T0)


def estimate_record(a: str, peers: list[str], real_ns: int, step: dict | None = None) -> dict:
    step = step or {}
    t_ref = real_ns + round(true_offset(a, real_ns) + step.get(a, 0))
    pairs = [{"peer": b, "offset_ns": true_offset(b, real_ns) + step.get(b, 0) - true_offset(a, real_ns) - step.get(a, 0),
              "drift_ppm": TRUTH[b][1] - TRUTH[a][1], "sigma_ns": 80.0, "min_owd_ns": 4000.0, "probes_used": 700}
             for b in peers]
    return {"kind": "clock.estimate", "ts": real_ns / 1e9,
            "data": {"format": "lockstep.clock.estimate/v1", "node": a, "t_ref_ns": t_ref, "window_s": 2.0,
                     "timestamping": "software", "pairs": pairs, "failed": [], "synced": False}}


def post(cluster, host, seq, records):
    return Client(HTTP_AUTHORIZATION=f"Bearer {cluster.credentials[host]}").post(
        "/api/v1/agent/telemetry", json.dumps({"seq": seq, "records": records}), content_type="application/json")


def report_round(cluster, seq, real_ns, step=None, capture=None):
    for host in sorted(TRUTH):
        peers = [p for p in sorted(TRUTH) if p > host]
        if peers:
            with capture(execute=True):
                assert post(cluster, host, seq, [estimate_record(host, peers, real_ns, step)]).status_code == 202


def test_start_plans_a_ring_and_starts_clock_sync_on_every_ready_node(cluster):
    sync = services.start(cluster, peers=2, window_s=1.0)
    assert sync.planned == sorted(TRUTH) and sync.reference.name == "c-node0" and sync.nodes_total == 3
    sent = plans(cluster)
    assert sorted(sent) == sorted(TRUTH)
    for i, host in enumerate(sorted(TRUTH)):
        args = sent[host]["args"]
        assert sent[host]["name"] == "clock.sync" and sent[host]["state"] == "running"
        assert args["name"] == host and args["address"] == f"10.9.0.{i + 1}" and args["window_s"] == 1.0
        assert sorted(p for p, _ in args["peers"]) == sorted(set(TRUTH) - {host})  # every pair is listed both ways
    assert sent["c-node0"]["args"]["correction"]["offset_ns"] == 0.0  # the reference is synced by definition
    assert sent["c-node1"]["args"]["correction"] is None


def test_estimates_are_solved_into_offsets_within_the_bound_and_corrections_are_sent(
        cluster, eager_tasks, django_capture_on_commit_callbacks, settings):
    settings.LOCKSTEP = {**settings.LOCKSTEP, "CLOCK_SOLVE_MIN_INTERVAL_S": 0, "CLOCK_ESTIMATE_MAX_AGE_S": 10**9}
    services.start(cluster)
    issued = Command.objects.count()
    report_round(cluster, 1, T0, capture=django_capture_on_commit_callbacks)
    sync = ClockSync.objects.get(cluster=cluster)
    assert sync.nodes_synced == 3 and sync.solved_at is not None and sync.flagged == [] and sync.disconnected == []
    clocks = {c.node.name: c for c in NodeClock.objects.filter(cluster=cluster)}
    assert clocks["c-node0"].state == ClockState.REFERENCE
    for host in ("c-node1", "c-node2"):
        c = clocks[host]
        assert c.state == ClockState.SYNCED and abs(c.offset_ns - true_offset(host, T0)) <= c.bound_ns
        assert c.drift_ppm == pytest.approx(TRUTH[host][1], abs=0.01) and c.bound_ns == pytest.approx(3 * c.sigma_ns)
        assert c.history[-1][1] == pytest.approx(c.offset_ns, abs=0.1)
    assert sync.worst_bound_ns == max(c.bound_ns for c in clocks.values())
    # every newly synced node got its correction in a re-plan
    corrections = {c.node.name: c.args["args"]["correction"]
                   for c in Command.objects.filter(cluster=cluster, type="activity.set").order_by("created")[issued:]}
    assert sorted(corrections) == ["c-node1", "c-node2"]
    for host, corr in corrections.items():
        assert corr["offset_ns"] == clocks[host].offset_ns and corr["t_ref_ns"] == clocks[host].t_local_ns
        assert corr["reference"] == "c-node0"
    assert PairEstimate.objects.filter(cluster=cluster).count() == 3
    assert REGISTRY.get_sample_value("lockstep_clock_worst_bound_ns", {
        "organization_id": str(cluster.organization_id), "cluster_id": str(cluster.pk)}) == sync.worst_bound_ns

    # a 2 ms step of node2's clock: detected, counted, corrected at once
    later = T0 + 4 * 10**9
    before = Command.objects.count()
    report_round(cluster, 2, later, step={"c-node2": 2_000_000}, capture=django_capture_on_commit_callbacks)
    node2 = NodeClock.objects.get(node__name="c-node2", cluster=cluster)
    assert node2.steps == 1 and node2.last_step_ns == pytest.approx(2_000_000, abs=1000)
    assert abs(node2.offset_ns - (true_offset("c-node2", later) + 2_000_000)) <= node2.bound_ns
    sent = [c for c in Command.objects.filter(cluster=cluster).order_by("created")[before:] if c.node.name == "c-node2"]
    assert sent and sent[-1].args["args"]["correction"]["offset_ns"] == node2.offset_ns
    assert NodeClock.objects.get(node__name="c-node1", cluster=cluster).steps == 0


@pytest.fixture
def synced_at(cluster, eager_tasks, django_capture_on_commit_callbacks, settings):
    """Clock sync started and one round solved, 8 s ago; rounds every 2 s from there (a real
    estimate age, so the 30 s settling after a step applies)."""
    settings.LOCKSTEP = {**settings.LOCKSTEP, "CLOCK_SOLVE_MIN_INTERVAL_S": 0, "CLOCK_ESTIMATE_MAX_AGE_S": 30}
    services.start(cluster)
    now = time.time_ns()
    report_round(cluster, 1, now - 8 * 10**9, capture=django_capture_on_commit_callbacks)
    return now


def test_a_step_the_first_solve_sees_only_partly_is_counted_once_at_its_whole_size_and_not_taken_for_jitter(
        cluster, synced_at, django_capture_on_commit_callbacks):
    # Estimates from before a step linger in the first solves after it (a peer's probe window
    # straddles it): here the first round carries 99.4 % of a 3 ms step, the next the whole step.
    before = NodeClock.objects.get(node__name="c-node2", cluster=cluster)
    report_round(cluster, 2, synced_at - 6 * 10**9, step={"c-node2": 2_982_000}, capture=django_capture_on_commit_callbacks)
    first = NodeClock.objects.get(node__name="c-node2", cluster=cluster)
    assert first.steps == 1 and first.last_step_ns == pytest.approx(2_982_000, abs=1000)
    issued = Command.objects.count()
    report_round(cluster, 3, synced_at - 4 * 10**9, step={"c-node2": 3_000_000}, capture=django_capture_on_commit_callbacks)
    node2 = NodeClock.objects.get(node__name="c-node2", cluster=cluster)
    assert node2.steps == 1 and node2.last_step_ns == pytest.approx(3_000_000, abs=1000)
    assert node2.jitter_ns == before.jitter_ns and node2.bound_ns < 1000
    # the rest of the step (18 µs) is corrected at once, as the step was (by the solve that saw it:
    # each node's report solves again, and later solves of the round move it by less than its bound)
    sent = [c for c in Command.objects.filter(cluster=cluster).order_by("created")[issued:] if c.node.name == "c-node2"]
    assert sent and abs(sent[-1].args["args"]["correction"]["offset_ns"] - node2.offset_ns) < node2.bound_ns


def test_a_neighbour_pulled_by_another_nodes_step_is_corrected_but_not_counted_as_stepped(
        cluster, synced_at, django_capture_on_commit_callbacks):
    # node2 steps by 3 ms; the solve, still holding estimates from before the step, moves node1
    # by 40 µs (over the 10 µs step floor) and then back.
    before = NodeClock.objects.get(node__name="c-node1", cluster=cluster)
    report_round(cluster, 2, synced_at - 6 * 10**9, step={"c-node2": 3_000_000, "c-node1": 40_000},
                 capture=django_capture_on_commit_callbacks)
    report_round(cluster, 3, synced_at - 4 * 10**9, step={"c-node2": 3_000_000}, capture=django_capture_on_commit_callbacks)
    node1 = NodeClock.objects.get(node__name="c-node1", cluster=cluster)
    node2 = NodeClock.objects.get(node__name="c-node2", cluster=cluster)
    assert node2.steps == 1 and node2.last_step_ns == pytest.approx(3_000_000, abs=1000)
    assert node1.steps == 0 and node1.jitter_ns == before.jitter_ns and node1.bound_ns < 1000
    assert abs(node1.offset_ns - true_offset("c-node1", synced_at - 4 * 10**9)) <= node1.bound_ns


@pytest.mark.parametrize(("data", "field"), [
    ({"t_ref_ns": T0, "pairs": [{"peer": "x", "offset_ns": "big", "drift_ppm": 0, "sigma_ns": 1}]},
     "records[0].data.pairs[0].offset_ns"),
    ({"t_ref_ns": T0, "pairs": [{"peer": "x", "offset_ns": 1, "drift_ppm": 0}]}, "records[0].data.pairs[0].sigma_ns"),
    ({"node": "c-node0", "pairs": []}, "records[0].data.t_ref_ns"),
    ({"node": "c-node0", "t_ref_ns": T0, "pairs": [{"peer": "x", "offset_ns": 1, "drift_ppm": 1e9, "sigma_ns": 1}]},
     "records[0].data.pairs[0].drift_ppm"),
])
def test_a_bad_clock_estimate_is_refused_naming_the_field_and_nothing_is_stored(cluster, data, field):
    services.start(cluster)
    data = {"node": "c-node0", **data}
    response = post(cluster, "c-node0", 9, [{"kind": "clock.estimate", "ts": T0 / 1e9, "data": data}])
    assert response.status_code == 400 and list(response.json()["fields"]) == [field], response.json()
    assert not PairEstimate.objects.filter(cluster=cluster).exists()


def test_members_read_clock_state_operators_start_and_stop_and_outsiders_see_nothing(world, cluster):
    owner, viewer, outsider = world.session("alice"), world.client("bob"), world.client("charlie")
    assert viewer.post("/api/v1/clock-syncs/", {"cluster": cluster.pk}, format="json").status_code == 403
    assert outsider.post("/api/v1/clock-syncs/", {"cluster": cluster.pk}, format="json").status_code == 400
    bad = owner.post("/api/v1/clock-syncs/", {"cluster": cluster.pk, "peers": 99}, format="json")
    assert bad.status_code == 400 and "peers" in bad.json()["fields"]
    assert not ClockSync.objects.filter(cluster=cluster).exists()
    created = owner.post("/api/v1/clock-syncs/", {"cluster": cluster.pk, "window_s": 1.0}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["reference_name"] == "c-node0" and body["planned"] == sorted(TRUTH) and body["window_s"] == 1.0
    listed = viewer.get("/api/v1/clock-syncs/", {"cluster": cluster.pk}).json()["results"]
    assert [r["id"] for r in listed] == [body["id"]]
    assert outsider.get("/api/v1/clock-syncs/").json()["results"] == []
    assert outsider.get(f"/api/v1/clock-syncs/{body['id']}/").status_code == 404
    assert outsider.delete(f"/api/v1/clock-syncs/{body['id']}/").status_code == 404
    nodes = viewer.get("/api/v1/node-clocks/", {"cluster": cluster.pk}).json()["results"]
    assert {n["node_name"]: n["state"] for n in nodes} == {"c-node0": "reference"}
    assert outsider.get("/api/v1/node-clocks/").json()["results"] == []
    assert viewer.delete(f"/api/v1/clock-syncs/{body['id']}/").status_code == 403
    assert owner.delete(f"/api/v1/clock-syncs/{body['id']}/").status_code == 204
    assert not ClockSync.objects.filter(cluster=cluster).exists()
    stops = Command.objects.filter(cluster=cluster, type="activity.set", args__state="stopped")
    assert sorted(c.node.name for c in stops) == sorted(TRUTH)


def test_the_sweep_replans_when_a_node_leaves_and_marks_silent_nodes_stale(
        cluster, eager_tasks, django_capture_on_commit_callbacks, settings):
    from datetime import timedelta

    from django.utils import timezone

    from console.clocks import tasks
    from console.fleet.models import Node, NodeState

    settings.LOCKSTEP = {**settings.LOCKSTEP, "CLOCK_SOLVE_MIN_INTERVAL_S": 0, "CLOCK_ESTIMATE_MAX_AGE_S": 10**9}
    services.start(cluster)
    report_round(cluster, 1, T0, capture=django_capture_on_commit_callbacks)
    assert tasks.replan_and_sweep() == 1  # nothing changed: the graph stays, nobody is stale
    assert set(NodeClock.objects.filter(cluster=cluster).values_list("state", flat=True)) == {"reference", "synced"}

    settings.LOCKSTEP = {**settings.LOCKSTEP, "CLOCK_ESTIMATE_MAX_AGE_S": 30}
    NodeClock.objects.filter(cluster=cluster).update(solved_at=timezone.now() - timedelta(minutes=5))
    Node.objects.filter(cluster=cluster, name="c-node2").update(state=NodeState.LOST)
    before = Command.objects.count()
    tasks.replan_and_sweep()
    sync = ClockSync.objects.get(cluster=cluster)
    assert sync.planned == ["c-node0", "c-node1"] and sync.nodes_total == 2
    replanned = {c.node.name: c.args["args"] for c in Command.objects.order_by("created")[before:]}
    assert sorted(replanned) == ["c-node0", "c-node1"]
    assert replanned["c-node1"]["peers"] == [["c-node0", "10.9.0.1"]]
    assert NodeClock.objects.get(cluster=cluster, node__name="c-node1").state == ClockState.STALE
