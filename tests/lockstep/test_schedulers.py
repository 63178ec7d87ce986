"""The scheduler plugins against fakes of Slurm's commands and of the Kubernetes API (named as
fakes: neither can run on these machines), through the plugins' real code paths."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from lockstep.schedulers import NoSpare, get_scheduler, names
from tests.lockstep.fakes.fake_kube_api import FakeKubeAPI

FAKES = Path(__file__).parent / "fakes"


def orchestrator(nodes=(), job="llm", nnodes=1):
    return SimpleNamespace(job=job, token="tok-" + "x" * 28, nnodes=nnodes, port=29777, spares_used=0,
                           nodes={i: SimpleNamespace(node=i, host=h, alive=True, spares=0, conn=object())
                                  for i, h in enumerate(nodes)},
                           host_for_nodes=lambda: "10.0.0.1")


def test_the_registry_names_every_plugin_and_refuses_an_unknown_one():
    assert names() == ["kubernetes", "local", "slurm"]
    with pytest.raises(ValueError, match="unknown scheduler 'pbs'"):
        get_scheduler("pbs", orchestrator())


@pytest.fixture
def slurm_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", f"{FAKES / 'slurm-bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("FAKE_SLURM_JOB_ID", "4242")
    monkeypatch.setenv("FAKE_SLURM_NODELIST", "gpu-a[01-03]")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.log"))
    monkeypatch.setenv("LOCKSTEP_LAUNCH", "{}")
    return tmp_path / "srun.log"


def test_slurm_spares_are_the_allocations_nodes_without_a_rank(slurm_env):
    sched = get_scheduler("slurm", orchestrator(["gpu-a01", "gpu-a02.cluster"]))
    assert sched.allocation() == ["gpu-a01", "gpu-a02", "gpu-a03"]
    assert sched.spares() == ["gpu-a03"]
    assert sched.spare_count() == 1


def test_slurm_starts_a_node_supervisor_on_the_spare_with_srun_and_no_token_on_the_command_line(slurm_env, monkeypatch):
    # The fake srun runs the command here; the join supervisor then exits at once (LOCKSTEP_LAUNCH is empty).
    sched = get_scheduler("slurm", orchestrator(["gpu-a01", "gpu-a02"], nnodes=2))
    started = asyncio.run(sched.start_replacement(rank=3, generation=2, incarnation="llm-r3-g2-ab", lost_node=1))
    assert started["host"] == "gpu-a03" and started["node"] == 2
    argv = sched.command("gpu-a03", node=2, rank=3, generation=2, incarnation="llm-r3-g2-ab")
    assert argv[:6] == ["srun", "--jobid=4242", "--nodes=1", "--ntasks=1", "--nodelist=gpu-a03", "--overlap"]
    assert argv[-5:] == ["--join", "2", "3", "2", "llm-r3-g2-ab"]
    assert "LOCKSTEP_ORCHESTRATOR=10.0.0.1:29777" in argv[6]
    assert not any("tok-" in a for a in argv)
    sched.procs[0].wait(60)
    (entry,) = [json.loads(line) for line in slurm_env.read_text().splitlines()]
    assert entry["opts"]["nodelist"] == "gpu-a03" and not entry["token_on_command_line"]
    # The spare is used now: the next loss finds none.
    with pytest.raises(NoSpare, match="no spare node left in Slurm job 4242"):
        asyncio.run(sched.start_replacement(rank=1, generation=3, incarnation="x", lost_node=0))


def test_slurm_outside_an_allocation_says_so(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    sched = get_scheduler("slurm", orchestrator())
    assert sched.spare_count() == 0
    with pytest.raises(NoSpare, match="SLURM_JOB_ID is not set"):
        sched.allocation()


@pytest.fixture
def kube(monkeypatch):
    from kubernetes import client

    api = FakeKubeAPI()
    cfg = client.Configuration(host=api.url)
    monkeypatch.setenv("LOCKSTEP_K8S_NAMESPACE", "research")
    monkeypatch.setenv("LOCKSTEP_K8S_PYTORCHJOB", "llm-pretrain")
    monkeypatch.setenv("LOCKSTEP_LAUNCH", '{"nnodes": 2}')
    yield api, client.ApiClient(cfg)
    api.close()


def test_kubernetes_builds_the_spare_pod_from_the_pytorchjobs_worker_template(kube):
    from lockstep.schedulers.kubernetes import KubernetesScheduler

    api, api_client = kube
    sched = KubernetesScheduler(orchestrator(["a", "b"], job="llm", nnodes=2), api_client=api_client)
    started = asyncio.run(sched.start_replacement(rank=5, generation=1, incarnation="llm-r5-g1-cd", lost_node=1))
    assert started["host"] == "llm-lockstep-r5-g1"
    pod = api.pods["llm-lockstep-r5-g1"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "5d0c1b7e-2a37-4a5e-9f4b-7d1a3c2e9b10"
    assert pod["metadata"]["labels"]["training.kubeflow.org/job-name"] == "llm-pretrain"
    assert pod["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod["spec"]["nodeSelector"] == {"gpu": "h200"} and pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "registry.example/llm:2026.11"
    assert c["command"][-5:] == ["--join", "2", "5", "1", "llm-r5-g1-cd"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert env["LOCKSTEP_ORCHESTRATOR"]["value"] == "10.0.0.1:29777"
    assert env["LOCKSTEP_JOB_TOKEN"] == {"name": "LOCKSTEP_JOB_TOKEN",
                                         "valueFrom": {"secretKeyRef": {"name": "lockstep-llm", "key": "token"}}}
    assert "tok-" not in json.dumps(pod)
    assert "lockstep-llm" in api.secrets
    with pytest.raises(NoSpare, match="no spare pod left for rank 2"):
        asyncio.run(sched.start_replacement(rank=2, generation=2, incarnation="y", lost_node=0))


def test_kubernetes_names_a_missing_pytorchjob(kube, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    from lockstep.schedulers.kubernetes import KubernetesScheduler

    api, api_client = kube
    monkeypatch.setenv("LOCKSTEP_K8S_PYTORCHJOB", "nope")
    sched = KubernetesScheduler(orchestrator(job="llm"), api_client=api_client)
    with pytest.raises(ApiException) as err:
        asyncio.run(sched.start_replacement(rank=0, generation=1, incarnation="z", lost_node=None))
    assert err.value.status == 404 and "nope" in err.value.body
