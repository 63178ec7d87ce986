"""Audits in the console: start (idempotent, refused while running), the node phase from the
agents' results, the verdict naming each failing element and why, unreachable and silent nodes,
cancel, the report as JSON and PDF, schedules, post-maintenance gating; owner, member, outsider.

The node reports are made by the agent's own report code (``agent.audit.results``), as its
``audit.node`` command returns them; they reach the console through the agent result endpoint.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from pypdf import PdfReader

from agent.audit.results import bad, ok, report
from console.audits import services
from console.audits.models import AuditFinding, AuditNode, AuditRun, AuditSchedule
from console.audits.tasks import advance_audits, start_scheduled_audits
from console.commands.models import Command, CommandState
from console.fleet import services as fleet
from console.fleet.models import Cluster, Node, NodeState
from tests.factories import inventory_doc, make_enrollment_token

HOSTS = ["gpu-a", "gpu-b", "gpu-c"]
HOST_FACTS = {"kernel": "6.1.0-18-amd64", "gpu_driver": "565.57.01", "nccl": ["2.23.4"], "gpu_count": 8}


def topology() -> dict:
    return {
        "format": "lockstep.topology/v1", "name": "audit-fabric",
        "hosts": [{"name": h} for h in HOSTS],
        "switches": [{"name": "leaf-0", "tier": "leaf"}],
        "nics": [{"name": f"{h}/nic0", "host": h, "rail": 0} for h in HOSTS],
        "links": [{"id": f"{h}/nic0~leaf-0", "a": f"{h}/nic0", "b": "leaf-0"} for h in HOSTS],
    }


class Site:
    def __init__(self, organization, name="audited"):
        self.cluster = Cluster.objects.create(organization=organization, name=name)
        fleet.import_topology(self.cluster, topology())
        token = make_enrollment_token(self.cluster, max_uses=10)
        self.nodes, self.credentials = {}, {}
        for host in HOSTS:
            enrolled = fleet.enroll(token, {"hostname": host, "machine_id": f"{name}-{host}"})
            fleet.apply_inventory(enrolled.node, inventory_doc(host, f"{name}-{host}"))
            fleet.mark_seen(enrolled.node)
            self.nodes[host], self.credentials[host] = enrolled.node, enrolled.credential

    def agent(self, host) -> Client:
        return Client(HTTP_AUTHORIZATION=f"Bearer {self.credentials[host]}")

    def answer(self, run_id, host, result=None, status="succeeded", error=""):
        """The host's agent polls and posts its node report for this run."""
        command = AuditNode.objects.get(run_id=run_id, node=self.nodes[host]).check_command
        polled = self.agent(host).get("/api/v1/agent/commands?wait=0").json()["commands"]
        assert str(command.pk) in [c["id"] for c in polled]
        response = self.agent(host).post(f"/api/v1/agent/commands/{command.pk}/result",
                                         {"status": status, "result": result, "error": error},
                                         content_type="application/json")
        assert response.json() == {"accepted": True}


def healthy(host: str, **facts) -> dict:
    results = [ok("gpu.ecc", {"kind": "gpu", "name": "GPU 0", "index": 0}, "No ECC errors.", {"dbe": 0}, {"dbe": 0}),
               ok("nic.mtu", {"kind": "nic", "name": "nic0"}, "MTU 9000.", {"mtu": 9000}, {"mtu": 9000})]
    return report("node", results, hardware="h100-sxm", facts={"host": HOST_FACTS | {"hostname": host} | facts},
                  errors=[])


def remapped(host: str) -> dict:
    results = [bad("gpu.row_remap", {"kind": "gpu", "name": "GPU 2", "index": 2}, "fail", "DCGM_FR_PENDING_ROW_REMAP",
                   "reset", "GPU 2 has a pending row remap.", "Reset the GPU.", {"pending": 1}, {"pending": 0})]
    return report("node", results, hardware="h100-sxm", facts={"host": HOST_FACTS | {"hostname": host}}, errors=[])


@pytest.fixture
def site(world):
    return Site(world.acme)


def start(world, site, who="alice", **body):
    return world.client(who).post(f"/api/v1/clusters/{site.cluster.pk}/audits/", {"options": {"load": False}} | body,
                                  format="json")


@pytest.mark.django_db
def test_an_audit_checks_every_node_and_names_the_failing_gpu_and_why(world, site):
    response = start(world, site)
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    assert response.json()["state"] == "running" and response.json()["phase"] == "nodes"
    commands = Command.objects.filter(cluster=site.cluster, type="audit.node")
    assert commands.count() == 3  # the fabric NICs, at the fabric's MTU and speed (from the inventory):
    assert commands.get(node=site.nodes["gpu-a"]).args["nics"] == [{"device": "nic0", "rail": 0, "mtu": 9000,
                                                                    "speed_mbps": 400000}]
    site.answer(run_id, "gpu-a", healthy("gpu-a"))
    site.answer(run_id, "gpu-b", remapped("gpu-b"))
    advance_audits()
    progress = world.client("bob").get(f"/api/v1/audits/{run_id}/").json()
    assert progress["state"] == "running" and progress["progress"]["failed"] == 1 and progress["progress"]["pending"] == 1
    site.answer(run_id, "gpu-c", healthy("gpu-c"))
    advance_audits()
    detail = world.client("bob").get(f"/api/v1/audits/{run_id}/").json()
    assert detail["state"] == "finished" and detail["verdict"] == "fail"
    assert [(c["kind"], c["name"]) for c in detail["culprits"]] == [("host", "gpu-b")]
    assert {n["name"]: n["outcome"] for n in detail["nodes"]} == {"gpu-a": "passed", "gpu-b": "failed",
                                                                  "gpu-c": "passed"}
    [finding] = detail["findings"]
    assert finding | {"id": 0} == {
        "id": 0, "phase": "nodes", "element_kind": "host", "element": "gpu-b", "check_name": "gpu.row_remap",
        "status": "fail", "culprit": True, "code": "DCGM_FR_PENDING_ROW_REMAP", "severity": "reset",
        "message": "GPU 2 has a pending row remap.", "action": "Reset the GPU.", "evidence": {"pending": 1},
        "threshold": {"pending": 0}}
    doc = world.client("bob").get(f"/api/v1/audits/{run_id}/report/").json()
    assert doc["format"] == "lockstep.audit.verdict/v1" and doc["fleet"]["outliers"] == []
    assert doc["verdict"] == {"format": "lockstep.verdict/v1", "network_ok": True,
                              "culprits": [{"kind": "host", "name": "gpu-b", "confidence": 1.0}]}


@pytest.mark.django_db
def test_a_healthy_cluster_passes_with_no_culprit_and_a_fleet_outlier_fails(world, site):
    run_id = start(world, site).json()["id"]
    for host in HOSTS:
        site.answer(run_id, host, healthy(host))
    advance_audits()
    run = AuditRun.objects.get(pk=run_id)
    assert run.verdict == "pass" and run.report["culprits"] == [] and not run.findings.exists()
    run_id = start(world, site).json()["id"]
    site.answer(run_id, "gpu-a", healthy("gpu-a"))
    site.answer(run_id, "gpu-b", healthy("gpu-b", nccl=["2.19.3"]))  # an outlier on the NCCL version
    site.answer(run_id, "gpu-c", healthy("gpu-c"))
    advance_audits()
    run = AuditRun.objects.get(pk=run_id)
    assert run.verdict == "fail" and [c["name"] for c in run.report["culprits"]] == ["gpu-b"]
    finding = run.findings.get()
    assert finding.check_name == "fleet.nccl" and "2.19.3" in finding.message and "2.23.4" in finding.message
    assert AuditNode.objects.get(run=run, node__name="gpu-b").outcome == "failed"


@pytest.mark.django_db
def test_an_unreachable_node_is_not_audited_never_passed_and_a_silent_one_fails_with_the_reason(world, site):
    Node.objects.filter(pk=site.nodes["gpu-c"].pk).update(state=NodeState.LOST)
    run_id = start(world, site, options={"load": False, "node_timeout_s": 5}).json()["id"]
    assert Command.objects.filter(type="audit.node", node=site.nodes["gpu-c"]).count() == 0
    site.answer(run_id, "gpu-a", healthy("gpu-a"))
    advance_audits()
    assert AuditRun.objects.get(pk=run_id).state == "running"  # gpu-b has time left
    AuditRun.objects.filter(pk=run_id).update(phase_deadline=timezone.now() - timedelta(seconds=1))
    advance_audits()
    run = AuditRun.objects.get(pk=run_id)
    outcomes = {n.node.name: (n.outcome, n.reason) for n in run.nodes.select_related("node")}
    assert outcomes["gpu-a"] == ("passed", "every check passed")
    assert outcomes["gpu-b"] == ("failed", "no answer to the node checks within 5 s")
    assert outcomes["gpu-c"][0] == "not_audited" and outcomes["gpu-c"][1].startswith("unreachable: the node is lost")
    assert run.verdict == "fail" and run.report["not_audited"] == ["gpu-c"]
    assert Command.objects.get(type="audit.node", node=site.nodes["gpu-b"]).state == CommandState.CANCELLED
    assert {(f.element, f.code, f.status) for f in run.findings.all()} == {
        ("gpu-b", "LOCKSTEP_FR_NO_ANSWER", "fail"), ("gpu-c", "LOCKSTEP_FR_NOT_AUDITED", "warn")}


@pytest.mark.django_db
def test_a_cluster_with_a_node_not_audited_is_at_best_a_warning(world, site):
    Node.objects.filter(pk=site.nodes["gpu-c"].pk).update(state=NodeState.LOST)
    run_id = start(world, site).json()["id"]
    for host in ("gpu-a", "gpu-b"):
        site.answer(run_id, host, healthy(host))
    advance_audits()
    assert AuditRun.objects.get(pk=run_id).verdict == "warn"


@pytest.mark.django_db
def test_start_is_idempotent_and_a_second_audit_of_the_same_nodes_is_refused(world, site):
    first = start(world, site, idempotency_key="handover-1")
    again = start(world, site, idempotency_key="handover-1")
    assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
    refused = start(world, site)
    assert refused.status_code == 409 and refused.json()["error"] == "audit_running"
    assert refused.json()["fields"]["nodes"] == (f"Audit {first.json()['id']} is already running on gpu-a, gpu-b, "
                                                 "gpu-c: wait for it to finish or cancel it.")
    assert AuditRun.objects.filter(cluster=site.cluster).count() == 1
    assert Command.objects.filter(type="audit.node").count() == 3


@pytest.mark.django_db
def test_bad_options_and_nodes_are_named_and_nothing_starts(world, site):
    response = start(world, site, options={"load_duration_s": 0, "colour": "red"})
    assert response.status_code == 400
    assert set(response.json()["fields"]) == {"options.load_duration_s", "options.colour"}
    foreign = Site(world.globex, "other").nodes["gpu-a"]
    response = start(world, site, nodes=[foreign.pk])
    assert response.status_code == 400 and str(foreign.pk) in response.json()["fields"]["nodes"]
    assert not AuditRun.objects.filter(cluster=site.cluster).exists()


@pytest.mark.django_db
def test_cancel_stops_the_run_and_its_commands(world, site):
    run_id = start(world, site).json()["id"]
    assert world.client("bob").post(f"/api/v1/audits/{run_id}/cancel/").status_code == 403
    response = world.client("carol").post(f"/api/v1/audits/{run_id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert set(Command.objects.filter(type="audit.node").values_list("state", flat=True)) == {"cancelled"}
    assert world.client("carol").post(f"/api/v1/audits/{run_id}/cancel/").status_code == 409
    assert start(world, site).status_code == 201  # the nodes are free again


@pytest.mark.django_db
def test_members_read_outsiders_see_nothing(world, site):
    run_id = start(world, site).json()["id"]
    assert start(world, site, who="bob").status_code == 403
    charlie = world.client("charlie")
    assert start(world, site, who="charlie").status_code == 404
    for path in (f"/api/v1/audits/{run_id}/", f"/api/v1/audits/{run_id}/report/", f"/api/v1/audits/{run_id}/pdf/"):
        assert charlie.get(path).status_code == 404, path
    assert charlie.post(f"/api/v1/audits/{run_id}/cancel/").status_code == 404
    assert charlie.get("/api/v1/audits/").json()["results"] == []
    assert [r["id"] for r in world.client("bob").get(f"/api/v1/audits/?cluster={site.cluster.pk}").json()["results"]] \
        == [run_id]
    assert AuditRun.objects.get(pk=run_id).state == "running"
    # pages: another organization's audit is "not found"
    session = world.session("charlie")
    assert session.get(f"/audits/{run_id}/").status_code == 404
    assert session.get(f"/audits/{run_id}/report.pdf").status_code == 404
    assert session.get(f"/clusters/{site.cluster.pk}/audits/").status_code == 404


@pytest.mark.django_db
def test_the_pdf_report_names_the_culprit_and_the_page_too(world, site):
    run_id = start(world, site).json()["id"]
    site.answer(run_id, "gpu-a", healthy("gpu-a"))
    site.answer(run_id, "gpu-b", remapped("gpu-b"))
    site.answer(run_id, "gpu-c", healthy("gpu-c"))
    advance_audits()
    response = world.client("bob").get(f"/api/v1/audits/{run_id}/pdf/")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    text = "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(response.content)).pages)
    assert "Verdict: Fail" in text and "host gpu-b" in text and "DCGM_FR_PENDING_ROW_REMAP" in text
    page = world.session("bob").get(f"/audits/{run_id}/").content.decode()
    assert 'data-name="gpu-b"' in page and "GPU 2 has a pending row remap." in page


@pytest.mark.django_db
def test_a_node_back_from_maintenance_returns_to_service_only_when_it_passes(world, site):
    node = site.nodes["gpu-a"]
    client = world.client("carol")
    assert client.post(f"/api/v1/nodes/{node.pk}/return-to-service/").status_code == 409  # not draining
    fleet.drain(node)
    response = client.post(f"/api/v1/nodes/{node.pk}/return-to-service/")
    assert response.status_code == 202 and response.json()["trigger"] == "maintenance"
    site.answer(response.json()["id"], "gpu-a", remapped("gpu-a"))
    advance_audits()
    node.refresh_from_db()
    assert node.state == NodeState.DRAINING  # it failed: it stays out of service
    response = client.post(f"/api/v1/nodes/{node.pk}/return-to-service/")
    site.answer(response.json()["id"], "gpu-a", healthy("gpu-a"))
    advance_audits()
    node.refresh_from_db()
    assert node.state == NodeState.READY
    assert AuditRun.objects.get(pk=response.json()["id"]).verdict == "pass"


@pytest.mark.django_db
def test_a_scheduled_audit_starts_when_due(world, site):
    url = f"/api/v1/clusters/{site.cluster.pk}/audit-schedule/"
    absent = world.client("carol").get(url)
    assert absent.status_code == 404 and "no audit schedule" in absent.json()["detail"]
    assert world.client("carol").put(url, {"interval_s": 60}, format="json").status_code == 400
    assert world.client("bob").put(url, {"interval_s": 3600}, format="json").status_code == 403
    response = world.client("carol").put(url, {"interval_s": 3600, "options": {"load": False}}, format="json")
    assert response.status_code == 200 and response.json()["interval_s"] == 3600
    assert start_scheduled_audits() == 0  # not due yet
    AuditSchedule.objects.filter(cluster=site.cluster).update(next_at=timezone.now() - timedelta(seconds=1))
    assert start_scheduled_audits() == 1
    run = AuditRun.objects.get(cluster=site.cluster)
    assert run.trigger == "scheduled" and run.options["load"] is False
    assert AuditSchedule.objects.get(cluster=site.cluster).next_at > timezone.now() + timedelta(seconds=3500)
    assert world.client("charlie").get(url).status_code == 404


@pytest.mark.django_db
def test_a_failed_node_check_fails_the_node_with_the_agents_error(world, site):
    run_id = start(world, site).json()["id"]
    site.answer(run_id, "gpu-a", status="failed", error="nvml: driver not loaded")
    for host in ("gpu-b", "gpu-c"):
        site.answer(run_id, host, healthy(host))
    services.advance(AuditRun.objects.get(pk=run_id))
    row = AuditNode.objects.get(run_id=run_id, node=site.nodes["gpu-a"])
    assert row.outcome == "failed" and row.reason == "the node checks failed: nvml: driver not loaded"
    assert AuditFinding.objects.get(run_id=run_id).code == "LOCKSTEP_FR_NO_ANSWER"


def _collective_result(world_size: int, time_s: float, minimum: float) -> dict:
    """What an agent's audit.collective returns (the agent's own evaluation)."""
    from agent.audit.collective import FORMAT, evaluate

    rows, check = evaluate("all_reduce", world_size, [{"size": 1 << 20, "time_s": time_s, "time_s_max": time_s}],
                           min_busbw_gbs=minimum, source="argument min_busbw_gbs")
    return {"format": FORMAT, "op": "all_reduce", "backend": "gloo", "world_size": world_size, "sizes": rows,
            "check": check, "status": check["status"], "errors": []}


@pytest.mark.django_db
def test_the_collective_phase_runs_each_rail_then_the_cluster_and_a_slow_group_fails_the_audit(world, site):
    response = start(world, site, options={"load": False, "collective": True, "collective_min_busbw_gbs": 1.0,
                                           "collective_size_bytes": 1 << 20})
    run_id = response.json()["id"]
    for host in HOSTS:
        site.answer(run_id, host, healthy(host))
    advance_audits()
    run = AuditRun.objects.get(pk=run_id)
    assert run.phase == "collective" and [g["name"] for g in run.plan["collective"]["groups"]] == ["rail 0", "cluster"]
    rail = Command.objects.filter(cluster=site.cluster, type="audit.collective").order_by("args__rank_offset")
    assert [(c.node.name, c.args["rank_offset"], c.args["world_size"], c.args["ifname"]) for c in rail] == [
        ("gpu-a", 0, 3, "nic0"), ("gpu-b", 1, 3, "nic0"), ("gpu-c", 2, 3, "nic0")]
    assert {c.args["init"] for c in rail} == {run.plan["collective"]["groups"][0]["init"]}
    assert all(c.args["min_busbw_gbs"] == 1.0 and c.args["sizes"] == [1 << 20] for c in rail)

    def answer_all(time_s):
        for command in Command.objects.filter(cluster=site.cluster, type="audit.collective",
                                              state=CommandState.PENDING):
            host = command.node.name
            site.agent(host).get("/api/v1/agent/commands?wait=0")
            response = site.agent(host).post(f"/api/v1/agent/commands/{command.pk}/result",
                                             {"status": "succeeded", "result": _collective_result(3, time_s, 1.0)},
                                             content_type="application/json")
            assert response.json() == {"accepted": True}

    answer_all(1e-5)  # the rail: ~140 GB/s
    advance_audits()
    run.refresh_from_db()
    assert run.state == "running" and run.plan["collective"]["step"] == "cluster"  # the rails first, then the cluster
    assert Command.objects.filter(cluster=site.cluster, type="audit.collective").count() == 6
    answer_all(0.01)  # across the cluster: ~0.14 GB/s, under the 1 GB/s floor
    advance_audits()
    detail = world.client("bob").get(f"/api/v1/audits/{run_id}/").json()
    assert detail["state"] == "finished" and detail["verdict"] == "fail" and detail["culprits"] == []
    [slow] = [f for f in detail["findings"] if f["phase"] == "collective"]
    assert slow["element"] == "collective cluster" and slow["code"] == "DCGM_FR_LOW_BANDWIDTH"
    assert slow["evidence"]["busbw_gbs"] < 1.0 and slow["threshold"]["min_busbw_gbs"] == 1.0
    doc = world.client("bob").get(f"/api/v1/audits/{run_id}/report/").json()
    assert [(g["element"]["name"], g["status"]) for g in doc["collective"]] == [("collective rail 0", "pass"),
                                                                               ("collective cluster", "fail")]


@pytest.mark.django_db
def test_a_collective_with_a_silent_node_fails_with_the_reason_and_bad_backend_is_named(world, site):
    bad = start(world, site, options={"collective": True, "collective_backend": "mpi"})
    assert bad.status_code == 400 and "collective_backend" in bad.content.decode()
    run_id = start(world, site, options={"load": False, "collective": True,
                                         "collective_timeout_s": 10}).json()["id"]
    for host in HOSTS:
        site.answer(run_id, host, healthy(host))
    advance_audits()
    AuditRun.objects.filter(pk=run_id).update(phase_deadline=timezone.now() - timedelta(seconds=1))
    advance_audits()  # the rails' deadline passed with no answer: then the cluster's
    AuditRun.objects.filter(pk=run_id).update(phase_deadline=timezone.now() - timedelta(seconds=1))
    advance_audits()
    detail = world.client("bob").get(f"/api/v1/audits/{run_id}/").json()
    assert detail["state"] == "finished" and detail["verdict"] == "fail"
    not_run = [f for f in detail["findings"] if f["phase"] == "collective"]
    assert {f["code"] for f in not_run} == {"LOCKSTEP_FR_COLLECTIVE_NOT_RUN"} and len(not_run) == 2
    assert "3 nodes did not answer" in not_run[0]["message"]
    assert not Command.objects.filter(cluster=site.cluster, type="audit.collective",
                                      state__in=["pending", "delivered"]).exists()  # cancelled
