"""End to end, CPU, gloo, 4 ranks: unmodified training scripts (they import nothing from
Lockstep) under ``lockstep run``; a rank is killed (``kill -9``) or migrated; the job finishes
and its final parameters are bitwise equal to a failure-free run of plain torchrun."""

from __future__ import annotations

import random

import pytest

from tests.lockstep.lockstep_helpers import AgentListener, assert_bitwise_equal, reference

pytestmark = pytest.mark.slow

CASES = {
    "mlp_sampler.py": ["20"],  # 320 steps
    "transformer_lm.py": ["40"],  # 320 optimizer steps, gradient accumulation
    "rank_seeded.py": ["400"],  # per-rank seeds, NumPy and random in every batch
    "manual_allreduce.py": ["200"],  # no DDP: one all_reduce per parameter, a barrier every 50 steps
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_kill_9_of_a_rank_at_a_random_moment_is_recovered_bitwise(script, job_factory, tmp_path_factory):
    args = CASES[script]
    expected = reference(tmp_path_factory.getbasetemp(), script, args)
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    rank = rng.randrange(4)
    job = job_factory(script, args)
    job.wait_step(rng.randrange(5, 60))
    job.kill_rank(rank)
    assert job.wait() == 0, f"seed {seed}, rank {rank}:\n{job.output[-4000:]}"
    assert_bitwise_equal(job.result(), expected)
    (rec,) = job.recoveries()
    assert rec["rank"] == rank and rec["ok"]
    assert rec["failure_to_resumed_s"] < 60
    # Where the recovery's time went, phase by phase, adds up to it.
    phases = rec["phases_s"]
    assert set(phases) == {"supervisors", "read_state", "start_replacements", "survivor_reports", "regroup"}
    assert abs(sum(phases.values()) - rec["failure_to_resumed_s"]) < 0.01


def test_kill_in_the_middle_of_the_backward_pass_is_recovered_bitwise(job_factory, tmp_path_factory, tmp_path):
    """The rank dies as it hands its second gradient bucket to the group: the survivors are
    blocked inside their backward pass with one bucket reduced and the next one in flight.
    The node agent hears about it on its local socket."""
    expected = reference(tmp_path_factory.getbasetemp(), "mlp_sampler.py", CASES["mlp_sampler.py"])
    agent = AgentListener(tmp_path / "agent.sock")
    step = random.randrange(30, 200)
    job = job_factory("mlp_sampler.py", CASES["mlp_sampler.py"],
                      env={"LOCKSTEP_FAULT": f"1:{step}:grad:1", "LOCKSTEP_AGENT_SOCKET": agent.path,
                           "LOCKSTEP_HEARTBEAT_EVENT_S": "1"})
    assert job.wait() == 0, job.output[-4000:]
    assert_bitwise_equal(job.result(), expected)
    (rec,) = job.recoveries()
    assert rec["rank"] == 1 and rec["resumed_at_step"] == step
    kinds = agent.kinds()
    for kind in ("job.heartbeat", "job.rank_lost", "job.migration_started", "job.migration_finished"):
        assert kind in kinds, kinds
    lost = next(e for e in agent.events if e["kind"] == "job.rank_lost")
    assert lost["v"] == 1 and lost["op"] == "event" and lost["data"]["rank"] == 1 and lost["data"]["job"] == job.name
    assert kinds.index("job.rank_lost") < kinds.index("job.migration_started") < kinds.index("job.migration_finished")
    beat = next(e for e in agent.events if e["kind"] == "job.heartbeat")
    assert len(beat["data"]["ranks"]) == 4


def test_kill_during_the_optimizer_step_is_recovered_bitwise(job_factory, tmp_path_factory):
    """Killed inside optimizer.step(): the survivors may already have stepped, so no rank holds
    the parameters the lost one started the step from; the replacement re-syncs after it."""
    expected = reference(tmp_path_factory.getbasetemp(), "rank_seeded.py", CASES["rank_seeded.py"])
    step = random.randrange(30, 300)
    job = job_factory("rank_seeded.py", CASES["rank_seeded.py"], env={"LOCKSTEP_FAULT": f"3:{step}:pre"})
    assert job.wait() == 0, job.output[-4000:]
    assert_bitwise_equal(job.result(), expected)
    assert [r["rank"] for r in job.recoveries()] == [3]


@pytest.mark.parametrize("script", ["mlp_sampler.py", "transformer_lm.py"])
def test_proactive_migration_at_a_random_step_is_bitwise(script, job_factory, tmp_path_factory):
    args = CASES[script]
    expected = reference(tmp_path_factory.getbasetemp(), script, args)
    rank = random.randrange(4)
    job = job_factory(script, args)
    job.wait_step(random.randrange(5, 40))
    done = job.cli("migrate", "--job", job.name, "--rank", str(rank), timeout=300)
    assert done.returncode == 0, done.stderr + job.output[-3000:]
    assert f"rank {rank} migrated at step" in done.stdout
    assert job.wait() == 0, job.output[-4000:]
    assert_bitwise_equal(job.result(), expected)


def test_a_killed_orchestrator_is_restarted_and_still_recovers_a_lost_rank(job_factory, tmp_path_factory):
    """The orchestrator is a child of node 0's ``lockstep run``: killed, it is started again from
    its journal, the ranks reconnect, and a later failure is recovered as before."""
    import os
    import signal
    from pathlib import Path

    expected = reference(tmp_path_factory.getbasetemp(), "mlp_sampler.py", CASES["mlp_sampler.py"])
    job = job_factory("mlp_sampler.py", CASES["mlp_sampler.py"])
    job.wait_step(10)
    (orch,) = [int(p) for p in os.listdir("/proc")
               if p.isdigit() and b"lockstep.orchestrator" in _cmdline(p) and job.name.encode() in _cmdline(p)]
    os.kill(orch, signal.SIGKILL)
    job.wait_step(60)
    job.kill_rank(2)
    assert job.wait() == 0, job.output[-4000:]
    assert "the orchestrator exited (-9); restarting it" in job.output
    assert_bitwise_equal(job.result(), expected)
    assert Path(job.state_dir, "jobs", job.name, "state.json").exists()


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
