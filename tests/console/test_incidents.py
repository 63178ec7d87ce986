"""Incidents from probe windows: the windows agents post are gathered per cluster and window,
triangulated once complete, and one fault is one incident that opens (after the hysteresis),
updates, and resolves when the windows are clean again; a flap is one incident; element health
and the cluster status follow; operators acknowledge and resolve through the API, scoped to
their organization; bad windows are refused by name and store nothing."""

from __future__ import annotations

import pytest

from console.celery import app
from console.core.models import Health
from console.fleet.models import Link, Nic, Node, NodeState, Switch
from console.incidents import services
from console.incidents.models import Incident, IncidentState, ProbeWindow, WindowState
from console.telemetry.models import TelemetryBatch
from tests.console.incidents_testlib import T0_NS, make_sim_cluster, post, records_by_host

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def eager_tasks(monkeypatch):
    """The triangulation task runs in the test's process (as on embedded defaults)."""
    monkeypatch.setitem(app.conf, "task_always_eager", True)


@pytest.fixture
def sim(world):
    return make_sim_cluster(world.acme)


def run_windows(sim, windows, capture, start=0):
    """Post each (observations) window in turn, running the handlers and tasks after each."""
    for i, observations in enumerate(windows, start=start):
        with capture(execute=True):
            assert set(sim.post_window(observations, i)) == {202}


def element(kind, name, cluster):
    model = {"link": Link, "switch": Switch, "nic": Nic}[kind]
    return model.objects.get(cluster=cluster, name=name)


def test_a_link_fault_opens_one_incident_naming_it_and_clean_windows_resolve_it(
        sim, django_capture_on_commit_callbacks):
    faulty, truth = sim.window("link_loss:1", seed=3)
    healthy, clean_truth = sim.window("none", seed=3)
    assert clean_truth["network_ok"] and len(truth["culprits"]) == 1
    culprit = truth["culprits"][0]

    run_windows(sim, [faulty], django_capture_on_commit_callbacks)
    window = ProbeWindow.objects.get(cluster=sim.cluster)
    assert window.state == WindowState.DONE and window.reported == window.expected == len(sim.topology["nics"])
    named = window.verdict["culprits"]
    assert [(c["kind"], c["name"]) for c in named] == [(culprit["kind"], culprit["name"])]
    # a confident culprit opens at once; a doubtful one waits for a second window (the tracker's tests)
    assert Incident.objects.exists() == (named[0]["confidence"] >= services.HYSTERESIS.open_confidence)

    run_windows(sim, [faulty], django_capture_on_commit_callbacks, start=1)
    incident = Incident.objects.get()
    assert (incident.kind, incident.culprit, incident.state) == (culprit["kind"], culprit["name"], IncidentState.OPEN)
    assert not incident.network_ok and incident.confidence > 0.5 and incident.windows in (1, 2)
    pairs = incident.evidence["during"]
    assert pairs and pairs[0]["loss"] > 0 and {"src", "dst", "sent", "lost", "share"} <= set(pairs[0])
    assert len(incident.evidence["before"]) == len(pairs)
    assert element(culprit["kind"], culprit["name"], sim.cluster).health in (Health.DEGRADED, Health.DOWN)

    windows_before = incident.windows
    run_windows(sim, [faulty] * 3, django_capture_on_commit_callbacks, start=2)
    incident.refresh_from_db()
    assert Incident.objects.count() == 1 and incident.windows == windows_before + 3
    assert [e.kind for e in incident.events.order_by("ts", "id")][:2] == ["opened", "window"]

    run_windows(sim, [healthy] * 4, django_capture_on_commit_callbacks, start=5)
    incident.refresh_from_db()
    assert incident.state == IncidentState.OPEN  # four clean windows: still open
    run_windows(sim, [healthy], django_capture_on_commit_callbacks, start=9)
    incident.refresh_from_db()
    assert incident.state == IncidentState.RESOLVED and incident.resolved_at is not None
    assert element(culprit["kind"], culprit["name"], sim.cluster).health == Health.OK
    assert incident.events.filter(kind="resolved").count() == 1


def test_short_windows_are_judged_on_the_evidence_of_the_last_second(sim, django_capture_on_commit_callbacks):
    faulty, truth = sim.window("link_loss:1", seed=3, window_s=0.25)
    healthy, _ = sim.window("none", seed=3, window_s=0.25)
    for i, observations in enumerate([faulty] * 5):
        with django_capture_on_commit_callbacks(execute=True):
            assert set(sim.post_window(observations, i, window_s=0.25)) == {202}
    windows = list(ProbeWindow.objects.filter(cluster=sim.cluster).order_by("start_ns"))
    assert [w.state for w in windows] == [WindowState.DONE] * 5
    assert [w.summary["evidence"]["windows"] for w in windows] == [1, 2, 3, 4, 4]  # services.EVIDENCE_S: 1 s
    assert windows[4].summary["evidence"]["from_start_ns"] == windows[1].start_ns
    incident = Incident.objects.get()
    assert (incident.kind, incident.culprit) == (truth["culprits"][0]["kind"], truth["culprits"][0]["name"])
    # the evidence of the window it opened on is that window's span: each pair's probes of all of it
    opened = incident.events.get(kind="opened").data["window_start_ns"]
    spanned = next(w for w in windows if w.start_ns == opened).summary["evidence"]["windows"]
    sent = {(p["src"], p["dst"]): p["sent"] for p in faulty["probes"]}
    assert all(p["sent"] == spanned * sent[(p["src"], p["dst"])] for p in incident.evidence["during"])
    # clean windows: resolved 5 s (services.HYSTERESIS.clear_s) after the last span holding the
    # fault, the three after the last faulty window included
    clean = 0
    while incident.state != IncidentState.RESOLVED and clean < 40:
        with django_capture_on_commit_callbacks(execute=True):
            sim.post_window(healthy, 5 + clean, window_s=0.25)
        clean += 1
        incident.refresh_from_db()
    assert services.HYSTERESIS.clear_s / 0.25 <= clean <= services.HYSTERESIS.clear_s / 0.25 + 3
    assert Incident.objects.count() == 1


def test_a_flapping_fault_is_one_incident_that_reopens(sim, django_capture_on_commit_callbacks):
    faulty, truth = sim.window("link_loss:1", seed=3)
    healthy, _ = sim.window("none", seed=3)
    flap = [faulty, faulty, healthy, faulty, healthy, healthy, faulty] + [healthy] * 5 + [faulty, faulty]
    run_windows(sim, flap, django_capture_on_commit_callbacks)
    incident = Incident.objects.get()
    assert incident.culprit == truth["culprits"][0]["name"] and incident.state == IncidentState.OPEN
    assert incident.reopened == 1 and incident.events.filter(kind="resolved").count() == 1


def test_a_frozen_host_is_named_as_the_host_and_the_network_is_ok(sim, django_capture_on_commit_callbacks):
    healthy, _ = sim.window("none", seed=5)
    host = sim.topology["hosts"][2]["name"]
    dead = {n["name"] for n in sim.topology["nics"] if n["host"] == host}
    frozen = {**healthy, "probes": [
        {**p, "lost": p["sent"]} if (p["src"] in dead or p["dst"] in dead) else p for p in healthy["probes"]]}
    for p in frozen["probes"]:
        if p["lost"] == p["sent"]:
            p.pop("owd_us", None)
            p.pop("owd_basis", None)
    others = [h for h in sim.nodes if h != host]
    for i in range(2):  # the frozen host posts nothing: its windows are triangulated once overdue
        with django_capture_on_commit_callbacks(execute=True):
            assert set(sim.post_window(frozen, i, hosts=others)) == {202}
    with django_capture_on_commit_callbacks(execute=True):
        sim.post_window(frozen, 2, hosts=others)
    window = ProbeWindow.objects.get(cluster=sim.cluster, start_ns=T0_NS)
    assert window.state == WindowState.DONE and window.reported < window.expected
    with django_capture_on_commit_callbacks(execute=True):
        sim.post_window(frozen, 3, hosts=others)
    incident = Incident.objects.get()
    assert (incident.kind, incident.culprit, incident.network_ok) == ("host", host, True)
    status = sim_status(sim)
    assert {n["name"]: n["health"] for n in status["nodes"]}[host] == Health.DOWN
    assert [i["culprit"] for i in status["incidents"]] == [host]


def sim_status(sim):
    from console.fleet.status import cluster_status

    return cluster_status(sim.cluster)


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r["probes"][0].update(lost=-1), "records[0].data.probes[0].lost"),
    (lambda r: r["probes"][0].update(lost=r["probes"][0]["sent"] + 1), "records[0].data.probes[0].lost"),
    (lambda r: r["probes"][0].update(via="sideways"), "records[0].data.probes[0].via"),
    (lambda r: r.update(format="lockstep.probe.window/v0"), "records[0].data.format"),
    (lambda r: r.pop("start_ns"), "records[0].data.start_ns"),
    (lambda r: r.update(window_s=-1), "records[0].data.window_s"),
])
def test_a_bad_probe_window_is_refused_by_field_and_nothing_is_stored(sim, change, field):
    healthy, _ = sim.window("none", seed=3)
    host = sorted(sim.nodes)[0]
    record = records_by_host(sim.topology, healthy, T0_NS)[host][0]
    change(record)
    response = post(sim.credentials[host], 1, [{"kind": "probe.window", "ts": T0_NS / 1e9 + 1, "data": record}])
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert not TelemetryBatch.objects.filter(node=sim.nodes[host]).exists()
    assert not ProbeWindow.objects.exists()


@pytest.mark.parametrize(("change", "field", "problem"), [
    (lambda own, foreign: foreign, "records[0].data.nic", "is not a NIC of"),
    (lambda own, foreign: {**own, "probes": [{**own["probes"][0], "dst": "nowhere/nic9"}]},
     "records[0].data.probes[0].dst", "'nowhere/nic9' is not a NIC of the cluster"),
])
def test_a_window_of_another_nodes_nic_or_naming_an_unknown_nic_is_refused_and_nothing_is_stored(
        sim, change, field, problem):
    healthy, _ = sim.window("none", seed=3)
    hosts = sorted(sim.nodes)
    by_host = records_by_host(sim.topology, healthy, T0_NS)
    record = change(by_host[hosts[0]][0], by_host[hosts[1]][0])  # node 0 posts it
    response = post(sim.credentials[hosts[0]], 1, [{"kind": "probe.window", "ts": T0_NS / 1e9 + 1, "data": record}])
    assert response.status_code == 400
    assert problem in response.json()["fields"][field], response.json()
    assert not TelemetryBatch.objects.filter(node=sim.nodes[hosts[0]]).exists()
    assert not ProbeWindow.objects.exists()


# --- the REST API --------------------------------------------------------------------------


@pytest.fixture
def incident(sim, django_capture_on_commit_callbacks):
    faulty, _ = sim.window("link_loss:1", seed=3)
    run_windows(sim, [faulty, faulty], django_capture_on_commit_callbacks)
    return Incident.objects.get()


def test_incidents_are_listed_with_filters_and_shown_with_evidence_and_timeline(world, sim, incident):
    api = world.client("bob")  # a viewer of the organization
    listed = api.get("/api/v1/incidents/", {"cluster": sim.cluster.pk, "state": "open"}).json()
    assert [i["id"] for i in listed["results"]] == [incident.pk]
    assert listed["results"][0]["culprit"] == incident.culprit and "evidence" not in listed["results"][0]
    for query in ({"state": "resolved"}, {"kind": "host"}, {"culprit": "nope"}, {"since": "2100-01-01T00:00:00Z"}):
        assert api.get("/api/v1/incidents/", query).json()["results"] == [], query
    assert len(api.get("/api/v1/incidents/", {"culprit": incident.culprit}).json()["results"]) == 1
    detail = api.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert detail["evidence"]["during"] and [e["kind"] for e in detail["timeline"]][0] == "opened"
    status = api.get(f"/api/v1/clusters/{sim.cluster.pk}/status/").json()
    links = {link["name"]: link["health"] for link in status["links"]}
    nics = {nic["name"]: nic["health"] for nic in status["nics"]}
    assert {**links, **nics}[incident.culprit] in ("degraded", "down")
    assert [i["id"] for i in status["incidents"]] == [incident.pk]
    windows = api.get("/api/v1/probe-windows/", {"cluster": sim.cluster.pk}).json()["results"]
    assert len(windows) == 2 and windows[0]["state"] == "done"


def test_acknowledge_and_resolve_need_an_operator_and_outsiders_see_nothing(world, sim, incident):
    url = f"/api/v1/incidents/{incident.pk}/"
    assert world.client("charlie").get(url).status_code == 404
    assert world.client("charlie").post(url + "acknowledge/").status_code == 404
    assert world.client("charlie").get("/api/v1/incidents/").json()["results"] == []
    assert world.client("bob").post(url + "acknowledge/").status_code == 403
    acked = world.client("carol").post(url + "acknowledge/")
    assert acked.status_code == 200 and acked.json()["state"] == "acknowledged"
    assert acked.json()["acknowledged_by"] == "carol"
    resolved = world.client("carol").post(url + "resolve/")
    assert resolved.status_code == 200 and resolved.json()["state"] == "resolved"
    again = world.client("carol").post(url + "resolve/")
    assert again.status_code == 409
    assert world.client("carol").post(url + "acknowledge/").status_code == 409
    assert element(incident.kind, incident.culprit, sim.cluster).health != Health.DEGRADED


# --- the probe plan ------------------------------------------------------------------------


def report_addresses(sim):
    for i, nic in enumerate(Nic.objects.filter(cluster=sim.cluster, in_topology=True).order_by("name")):
        Nic.objects.filter(pk=nic.pk).update(addresses=[f"10.9.{i // 200}.{i % 200 + 1}/24"])


def probe_mesh_commands(sim):
    from console.commands.models import Command

    return list(Command.objects.filter(cluster=sim.cluster, type="activity.set").order_by("created"))


def test_the_plan_is_pushed_to_every_ready_node_and_again_only_when_members_change(world, sim):
    report_addresses(sim)
    response = world.client("carol").post("/api/v1/probe-plans/", {"cluster": sim.cluster.pk}, format="json")
    assert response.status_code == 201, response.content
    plan = response.json()
    assert plan["nodes"] == len(sim.nodes) and plan["nics"] == len(sim.topology["nics"]) and plan["pairs"] > 0
    commands = probe_mesh_commands(sim)
    assert {c.node_id for c in commands} == {n.pk for n in sim.nodes.values()}
    args = commands[0].args["args"]
    assert commands[0].args["name"] == "probe.mesh"
    names = {nic["name"] for c in commands for nic in c.args["args"]["nics"]}
    assert names == {n["name"] for n in sim.topology["nics"]}
    assert all(peer[0] in names and peer[1].startswith("10.9.") for nic in args["nics"] for peer in nic["peers"])

    assert world.client("carol").post("/api/v1/probe-plans/", {"cluster": sim.cluster.pk},
                                      format="json").status_code == 201
    assert len(probe_mesh_commands(sim)) == len(commands)  # unchanged: nothing pushed
    assert services.refresh_probe_plans() == []

    lost = sorted(sim.nodes)[0]
    Node.objects.filter(pk=sim.nodes[lost].pk).update(state=NodeState.LOST)
    assert services.refresh_probe_plans() == [sim.cluster.pk]
    first = {c.pk for c in commands}
    pushed = [c for c in probe_mesh_commands(sim) if c.pk not in first]
    assert sim.nodes[lost].pk not in {c.node_id for c in pushed} and len(pushed) == len(sim.nodes) - 1
    gone = {n["name"] for n in sim.topology["nics"] if n["host"] == lost}
    peers = {peer[0] for c in pushed for nic in c.args["args"]["nics"] for peer in nic["peers"]}
    assert peers and not peers & gone, (gone, peers)


def test_a_plan_push_is_refused_to_a_viewer_and_an_outsider_and_names_a_bad_option(world, sim):
    report_addresses(sim)
    assert world.client("bob").post("/api/v1/probe-plans/", {"cluster": sim.cluster.pk},
                                    format="json").status_code == 403
    outsider = world.client("charlie").post("/api/v1/probe-plans/", {"cluster": sim.cluster.pk}, format="json")
    assert outsider.status_code == 400 and "cluster" in outsider.json()["fields"]
    bad = world.client("carol").post("/api/v1/probe-plans/", {"cluster": sim.cluster.pk,
                                                              "options": {"window_ms": 5}}, format="json")
    assert bad.status_code == 400 and "window_ms" in str(bad.json()["fields"]), bad.json()
    assert probe_mesh_commands(sim) == []


def test_the_incident_page_shows_the_heat_map_to_members_and_is_404_to_outsiders(world, sim, incident):
    url = f"/clusters/{sim.cluster.pk}/incidents/{incident.pk}/"
    page = world.session("bob").get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="heatmap"' in html and html.count('class="cell"') == len(incident.evidence["during"])
    assert incident.culprit in html and "opened" in html
    assert world.session("charlie").get(url).status_code == 404
    assert world.session("bob").get(f"/clusters/{sim.cluster.pk}/incidents/999999/").status_code == 404
    cluster_page = world.session("bob").get(f"/clusters/{sim.cluster.pk}/").content.decode()
    assert f'data-incident="{incident.pk}"' in cluster_page
