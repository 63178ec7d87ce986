"""What a node's supervisor does when the node running the orchestrator is lost (no processes:
the decisions of ``NodeSupervisor._orchestrator_node_lost``; the takeover itself, end to end, is
tests/lockstep/test_node_loss.py's)."""

from __future__ import annotations

import pytest

from lockstep.orchestrator import launchspec
from lockstep.orchestrator.node import NodeSupervisor

SUCCESSION = [{"node": 1, "standby": "10.0.0.2:4001"}, {"node": 2, "standby": "10.0.0.3:4002"}]


def supervisor(node: int) -> NodeSupervisor:
    spec = launchspec.LaunchSpec(nnodes=3, nproc_per_node=2, node_rank=node, master_addr="10.0.0.1", master_port=29500,
                                 rdzv_id=None, module=False, script="train.py")
    sup = NodeSupervisor(spec, job="j", spares=0, scheduler="local", quiet=True)
    sup.node_rank = node
    sup.done_requested = False
    sup.orch_addr, sup.orch_node, sup.succession = "10.0.0.1:4000", 0, list(SUCCESSION)
    return sup


def test_a_node_that_is_not_the_successor_follows_the_successor_and_waits_for_it():
    sup = supervisor(2)
    sup._orchestrator_node_lost(0, None)
    assert sup.orch_addr == "10.0.0.2:4001" and sup.orch_node == 1 and sup.takeover_wait is not None
    assert not sup.done


def test_the_first_successor_takes_over(monkeypatch):
    sup = supervisor(1)
    took = []
    monkeypatch.setattr(sup, "_take_over", took.append)
    sup._orchestrator_node_lost(0, None)
    assert took == [0] and sup.orch_node == 1


def test_a_clean_end_of_the_orchestrators_node_is_no_loss_and_a_stopped_one_stops_the_job():
    sup = supervisor(2)
    sup._orchestrator_node_lost(0, {"op": "bye", "code": 0})
    assert not sup.done and sup.orch_addr == "10.0.0.1:4000"
    sup._orchestrator_node_lost(0, {"op": "bye", "code": 143})
    assert sup.done and sup.exit_code == 143


@pytest.mark.parametrize("succession", [[], [{"node": 0, "standby": "10.0.0.1:4003"}]])
def test_with_no_successor_named_the_node_gives_the_job_up_with_status_1(succession):
    sup = supervisor(2)
    sup.succession = succession
    sup._orchestrator_node_lost(0, None)
    assert sup.done and sup.exit_code == 1


def test_a_loss_of_a_node_that_no_longer_runs_the_orchestrator_is_ignored():
    sup = supervisor(2)
    sup.orch_node = 1
    sup._orchestrator_node_lost(0, None)
    assert not sup.done and sup.orch_addr == "10.0.0.1:4000"
