"""The audit end to end: the real console (``manage.py serve``; with Redis a Celery worker and beat
too) and a real agent in every host of the emulated fabric (4 hosts x 2 rails, 2 spines, GPUs
through the NVML fake), audits started through the REST API:

- a healthy fabric passes, with no culprit;
- a policed cable (drops only under load) and a GPU with a pending row remap, injected at once,
  are the two culprits and nothing else;
- a NIC at the wrong MTU is the one culprit, found by the loaded fabric (large packets lost);
- a node back from maintenance with a GPU defect stays draining; healed, it returns to ready;
- a leaf with ECMP hashing off is the one culprit (its flows' traced uplinks), alone and with a
  wrong MTU elsewhere; a rate-limited cable (a degraded optic) and a cable lossy one way,
  injected at once, are the two culprits;
- the collective phase (gloo, each rail then the cluster) passes a healthy fabric, and a degraded
  cable fails its rail's group (no culprit: the load and the node checks localize).

The audits run the ``gpu`` section of the node checks only: the NVML fake has no PCIe tree, this
VM's clock is not disciplined, and an agent in a host namespace reads the root namespace's sysfs
NICs (the other sections are tested on recorded trees in tests/agent). A NIC at the wrong MTU is
found by the loaded fabric instead.
"""

from __future__ import annotations

import contextlib
import shutil

import pytest
import requests

from console.fleet import services as fleet
from console.fleet.models import Nic, Node, NodeState
from testbed import nvmlshim
from testbed.consolestack import ConsoleStack
from testbed.testing import wait_for
from tests.factories import make_enrollment_token
from tests.integration.conftest import process_env

pytestmark = [pytest.mark.netns, pytest.mark.slow]
OPTIONS = {"sections": ["gpu"], "listen_ms": 10, "load_duration_s": 3.0, "rate_mbit": 2.0,
           "flows_per_nic": 8, "node_timeout_s": 60}


def audit(api: requests.Session, base: str, cluster_id: int, **body) -> dict:
    response = api.post(f"{base}/api/v1/clusters/{cluster_id}/audits/", json={"options": OPTIONS} | body, timeout=30)
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    return wait_for(lambda: (r := api.get(f"{base}/api/v1/audits/{run_id}/", timeout=10).json())["state"] != "running"
                    and r, timeout=300, what=f"audit {run_id} to finish", interval=0.5)


def culprits(run: dict) -> set[tuple[str, str]]:
    return {(c["kind"], c["name"]) for c in run["culprits"]}


@contextlib.contextmanager
def audited(world, fab, tmp_path, name: str):
    """The console and an agent per host of `fab`, enrolled in a new cluster: (api, console url, cluster)."""
    cluster = fleet.create_cluster(world.acme.pk, name)
    fleet.import_topology(cluster, fab.state["topology"])
    token = make_enrollment_token(cluster, max_uses=100)
    env = process_env(LOCKSTEP_AUDIT_TICK_S="1", LOCKSTEP_SWEEP_INTERVAL_S="2")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {world.token('alice')}"
    _forget_enrollments(fab)
    with ConsoleStack(fab, env, tmp_path / "stack") as stack:
        fab.start_agents(console_url=stack.agent_url, token=token, cluster_id=cluster.pk,
                         env=nvmlshim.agent_env("hgx_h100") | {"LOCKSTEP_INVENTORY_INTERVAL_S": "5"})
        try:
            wait_for(lambda: Node.objects.filter(cluster=cluster, state=NodeState.READY).count() == 4
                     and Nic.objects.filter(cluster=cluster, in_topology=True).exclude(addresses=[]).count() == 8,
                     timeout=120, what="4 agents ready with their NICs' addresses", interval=0.5)
            yield api, stack.url, cluster
        finally:
            fab.heal_all()
            fab.stop_agents()
            _forget_enrollments(fab)


def _forget_enrollments(fab) -> None:
    """Each test's agents enroll afresh: the fabric outlives the test, its database does not."""
    for host in fab.hosts:
        shutil.rmtree(fab._agent_dir(host) / "state", ignore_errors=True)


@pytest.mark.timeout(900)
def test_a_leaf_with_ecmp_off_and_a_degraded_or_one_way_lossy_cable_are_named_alone_and_together(
        transactional_db, world, small_fabric, tmp_path):
    fab = small_fabric
    with audited(world, fab, tmp_path, "ecmp-and-cables") as (api, base, cluster):
        fab.fault_switch_ecmp_off("leaf-su01-r1")
        alone = audit(api, base, cluster.pk)
        assert alone["verdict"] == "fail" and culprits(alone) == {("switch", "leaf-su01-r1")}, alone["findings"]
        [ecmp] = [f for f in alone["findings"] if f["check_name"] == "fabric.ecmp"]
        assert ecmp["code"] == "LOCKSTEP_FR_ECMP_ONE_UPLINK" and len(ecmp["evidence"]["hops"]) == 1
        assert {n["outcome"] for n in alone["nodes"]} == {"passed"}  # a switch's fault fails no host

        fab.fault_nic_mtu("node0000/nic0", mtu=1200)  # with a second defect elsewhere
        truth = {(c["kind"], c["name"]) for c in fab.ground_truth()["culprits"]}
        two = audit(api, base, cluster.pk)
        assert culprits(two) == truth == {("switch", "leaf-su01-r1"), ("nic", "node0000/nic0")}, two["findings"]
        fab.heal_all()

        fab.fault_link_rate("node0001/nic0~leaf-su00-r0", rate_mbit=4)  # a degraded optic: queue, then drops
        fab.fault_link_loss("node0003/nic1~leaf-su01-r1", direction="a>b", rate=0.1)  # lossy one way only
        truth = {(c["kind"], c["name"]) for c in fab.ground_truth()["culprits"]}
        cables = audit(api, base, cluster.pk)
        assert culprits(cables) == truth == {("nic", "node0001/nic0"), ("nic", "node0003/nic1")}, cables["findings"]
        assert all(f["check_name"] == "fabric.load" for f in cables["findings"] if f["culprit"])


@pytest.mark.timeout(900)
def test_the_collective_phase_runs_each_rail_and_the_cluster_with_gloo_and_a_degraded_cable_fails_its_rail(
        transactional_db, world, small_fabric, tmp_path):
    pytest.importorskip("torch")
    options = {"load": False, "collective": True, "collective_size_bytes": 1 << 18, "collective_iters": 3,
               "collective_min_busbw_gbs": 0.002}  # 16 Mbit/s: a veth carries far more, a 4 Mbit/s cable less
    fab = small_fabric
    with audited(world, fab, tmp_path, "collective") as (api, base, cluster):
        healthy = audit(api, base, cluster.pk, options=OPTIONS | options)
        assert healthy["verdict"] == "pass", healthy["findings"]
        report = api.get(f"{base}/api/v1/audits/{healthy['id']}/report/", timeout=10).json()
        groups = {g["element"]["name"]: g for g in report["collective"]}
        assert set(groups) == {"collective rail 0", "collective rail 1", "collective cluster"}
        assert all(g["status"] == "pass" and g["evidence"]["busbw_gbs"] > 0.002 and g["evidence"]["world_size"] == 4
                   for g in groups.values()), groups

        fab.fault_link_rate("node0001/nic1~leaf-su00-r1", rate_mbit=4)
        slow = audit(api, base, cluster.pk, options=OPTIONS | options)
        assert slow["verdict"] == "fail" and slow["culprits"] == [], slow["findings"]
        report = api.get(f"{base}/api/v1/audits/{slow['id']}/report/", timeout=10).json()
        groups = {g["element"]["name"]: g for g in report["collective"]}
        assert groups["collective rail 0"]["status"] == "pass", groups
        assert groups["collective rail 1"]["status"] == "fail" and groups["collective rail 1"]["code"] == \
            "DCGM_FR_LOW_BANDWIDTH", groups
        assert groups["collective rail 1"]["evidence"]["busbw_gbs"] < 0.002


@pytest.mark.timeout(900)
def test_the_audit_passes_a_healthy_fabric_and_names_each_injected_fault(transactional_db, world, small_fabric,
                                                                         tmp_path):
    fab = small_fabric
    with audited(world, fab, tmp_path, "audited-fabric") as (api, base, cluster):
        healthy = audit(api, base, cluster.pk)
        assert healthy["verdict"] == "pass", [(f["element"], f["check_name"], f["message"]) for f in healthy["findings"]]
        assert healthy["culprits"] == [] and healthy["plan"]["load"]["flows"] > 0
        assert {n["outcome"] for n in healthy["nodes"]} == {"passed"}, healthy["nodes"]

        fab.fault_link_police("node0001/nic1~leaf-su00-r1", rate_mbit=4, direction="a>b")
        fab.fault_node_gpu("node0003", defect="remap-pending", gpu=2)
        truth = {(c["kind"], c["name"]) for c in fab.ground_truth()["culprits"]}
        two = audit(api, base, cluster.pk)
        assert two["verdict"] == "fail" and culprits(two) == truth == {("nic", "node0001/nic1"),
                                                                       ("host", "node0003")}, two["findings"]
        assert {f["code"] for f in two["findings"] if f["element"] == "node0003"} == {
            "DCGM_FR_PENDING_ROW_REMAP", "DCGM_FR_VOLATILE_DBE_DETECTED"}  # the fake's defect, as DCGM names it
        police = next(f for f in two["findings"] if f["element"] == "node0001/nic1")
        assert police["check_name"] == "fabric.load" and police["evidence"]["pairs"][0]["lost"] > 0
        fab.heal_all()

        fab.fault_nic_mtu("node0002/nic0", mtu=1200)
        mtu = audit(api, base, cluster.pk)
        assert culprits(mtu) == {("nic", "node0002/nic0")}, mtu["findings"]
        assert {f["check_name"] for f in mtu["findings"] if f["element"] == "node0002/nic0"} == {"fabric.load"}
        fab.heal_all()

        # post-maintenance gating: a failing node stays out of service, a passing one returns
        node = Node.objects.get(cluster=cluster, name="node0003")
        fleet.drain(node)
        fid = fab.fault_node_gpu("node0003", defect="remap-pending", gpu=2)
        run_id = api.post(f"{base}/api/v1/nodes/{node.pk}/return-to-service/", json={"options": OPTIONS},
                          timeout=30).json()["id"]
        wait_for(lambda: api.get(f"{base}/api/v1/audits/{run_id}/", timeout=10).json()["state"] == "finished",
                 timeout=120, what="the maintenance audit", interval=0.5)
        node.refresh_from_db()
        failed = api.get(f"{base}/api/v1/audits/{run_id}/", timeout=10).json()
        assert failed["trigger"] == "maintenance" and culprits(failed) == {("host", "node0003")}, failed["findings"]
        assert node.state == NodeState.DRAINING  # it failed: it stays out of service
        fab.heal(fid)
        run_id = api.post(f"{base}/api/v1/nodes/{node.pk}/return-to-service/", json={"options": OPTIONS},
                          timeout=30).json()["id"]
        wait_for(lambda: Node.objects.get(pk=node.pk).state == NodeState.READY, timeout=120,
                 what="node0003 back in service after passing its audit", interval=0.5)
        assert api.get(f"{base}/api/v1/audits/{run_id}/", timeout=10).json()["verdict"] == "pass"
