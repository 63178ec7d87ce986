"""The orchestrator's decisions, as pure functions."""

import pytest

from lockstep.orchestrator import core


def survivor(rank, step, done_seq, done_key, addr=None, groups=None):
    g = groups or {"default": core.GroupProgress(done_seq, done_key)}
    return core.SurvivorReport(rank, step, g, addr or f"h:{rank}")


def test_an_exit_by_signal_is_a_lost_rank_and_a_nonzero_status_is_a_failed_script():
    assert core.classify_exit(-9, 9, False) == "lost"
    assert core.classify_exit(1, None, False) == "failed"
    assert core.classify_exit(0, None, False) == "finished"
    assert core.classify_exit(-9, 9, True) == "migrated"


def test_survivors_one_collective_apart_rerun_from_the_slowest():
    survivors = [survivor(0, 10, 41, (10, 2)), survivor(1, 10, 42, (10, 3)), survivor(3, 10, 41, (10, 2))]
    plan = core.plan_recovery(1, survivors, {2: 10})
    assert plan.rerun_from_seq == {"default": 42}
    assert plan.live_after == {"default": [10, 2]}
    assert plan.resume_at == {2: 10}


def test_a_donor_still_at_the_lost_ranks_boundary_comes_first():
    survivors = [survivor(0, 11, 50, (10, 4), "a"), survivor(1, 10, 49, (10, 3), "b"), survivor(3, 11, 50, (10, 4), "c")]
    plan = core.plan_recovery(2, survivors, {2: 10})
    assert plan.donors[2][0] == "b"
    assert set(plan.donors[2]) == {"a", "b", "c"}


def test_survivors_two_collectives_apart_rerun_from_the_slowest():
    # a buffer broadcast's root ran ahead of a survivor whose completion the failure cut off
    plan = core.plan_recovery(1, [survivor(0, 5, 12, (5, 2)), survivor(1, 5, 10, (5, 0))], {2: 5})
    assert plan.rerun_from_seq == {"default": 11}
    assert plan.live_after == {"default": [5, 0]}


def test_survivors_further_apart_than_the_rerun_window_are_refused():
    gap = core.RERUN_WINDOW + 1
    with pytest.raises(core.Unrecoverable, match=f"{gap} collectives apart"):
        core.plan_recovery(1, [survivor(0, 5, 10, (5, 0)), survivor(1, 5, 10 + gap, (5, gap))], {2: 5})


def test_a_lost_rank_whose_last_replica_is_too_old_is_refused():
    with pytest.raises(core.Unrecoverable, match="last replicated step is 3"):
        core.plan_recovery(1, [survivor(0, 9, 10, (9, 0))], {1: 3})


def test_a_copy_one_step_behind_the_slowest_survivor_redoes_that_step_and_two_behind_is_refused():
    # What a lost node leaves under offnode's bound: its ranks' copies hold post(S - 1) at worst.
    plan = core.plan_recovery(1, [survivor(0, 8, 20, (8, 1)), survivor(1, 8, 20, (8, 1))], {2: 7, 3: 8})
    assert plan.resume_at == {2: 7, 3: 8} and plan.redo_steps == 1
    with pytest.raises(core.Unrecoverable, match="last replicated step is 6 but the survivors are at step 8"):
        core.plan_recovery(1, [survivor(0, 8, 20, (8, 1)), survivor(1, 9, 21, (9, 0))], {2: 6})


def test_no_survivor_means_no_replica():
    with pytest.raises(core.Unrecoverable, match="every rank was lost"):
        core.plan_recovery(1, [], {0: 4})


def test_point_to_point_traffic_makes_a_group_unrecoverable():
    g = {"default": core.GroupProgress(3, (1, 0), unprotected=["send"])}
    with pytest.raises(core.Unrecoverable, match="point-to-point"):
        core.plan_recovery(1, [survivor(0, 1, 3, (1, 0), groups=g)], {1: 1})


def test_a_rank_lost_before_its_first_step_resumes_at_zero():
    plan = core.plan_recovery(1, [survivor(0, 0, 0, None), survivor(1, 0, 0, None)], {2: None})
    assert plan.resume_at == {2: 0}
    assert plan.live_after == {"default": None}
    assert plan.rerun_from_seq == {"default": 1}


def test_the_hold_boundary_covers_heartbeat_staleness():
    assert core.hold_boundary([100, 101], step_time_s=0.01, lead_s=0.5) == 101 + 51
    assert core.hold_boundary([7], step_time_s=2.0) == 9
    with pytest.raises(ValueError):
        core.hold_boundary([], 0.1)


def test_a_replacement_prefers_the_lost_ranks_node_then_the_one_with_most_spares():
    nodes = {0: {"alive": True, "spares": 1}, 1: {"alive": True, "spares": 3}, 2: {"alive": False, "spares": 5}}
    assert core.pick_node(nodes, 0) == 0
    assert core.pick_node(nodes, 2) == 1
    assert core.pick_node({0: {"alive": True, "spares": 0}}, 0) is None


def test_copies_go_round_a_ring_and_the_first_successor_holds_the_orchestrator_nodes_copies():
    holders, succession = core.ring([0, 1, 2], leader=0)
    assert holders == {0: 1, 1: 2, 2: 0} and succession == [1, 2]
    holders, succession = core.ring([3, 1, 2], leader=2)
    assert holders == {1: 2, 2: 3, 3: 1} and succession == [3, 1]
    assert holders[2] == succession[0]
    assert core.ring([1, 2], leader=0) == ({1: 2, 2: 1}, [1, 2])  # the orchestrator's node is gone
    assert core.ring([0], leader=0) == ({}, [])


def test_silent_nodes_are_lost_after_the_timeout():
    assert core.lost_nodes({0: 10.0, 1: 8.0}, now=10.5, timeout_s=1.5) == [1]


def test_a_heartbeat_of_thousands_of_ranks_goes_in_parts_that_each_fit_the_agent_socket_line():
    import json

    from lockstep.events import MAX_LINE
    from lockstep.orchestrator.server import HEARTBEAT_RANKS_PER_EVENT

    rows = [{"rank": r, "step": 123456789, "step_time_s": 0.123456789012345, "node": r // 8, "state": "recovering"}
            for r in reversed(range(4096))]
    parts = core.heartbeat_parts(rows, HEARTBEAT_RANKS_PER_EVENT)
    assert [r["rank"] for part in parts for r in part] == list(range(4096))
    for part in parts:
        line = json.dumps({"v": 1, "op": "event", "kind": "job.heartbeat", "ts_ns": 1 << 62, "data": {
            "job": "j" * 64, "generation": 1 << 30, "world_size": 4096, "ranks": part}}, separators=(",", ":"))
        assert len(line) + 1 <= MAX_LINE


def test_heartbeat_parts_of_an_empty_job_is_one_empty_part_and_a_part_size_below_one_is_refused():
    assert core.heartbeat_parts([], 256) == [[]]
    with pytest.raises(ValueError, match="per_part"):
        core.heartbeat_parts([{"rank": 0}], 0)
