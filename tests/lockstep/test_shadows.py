"""Shadows (``LOCKSTEP_SHADOWS=1``): with a spare for every rank of its node and one more,
``lockstep run`` keeps a shadow per rank -- a replacement that fast-forwards behind the live rank, told every couple of
seconds how far it may go -- and a rank lost late in the job is taken over by its shadow, already
near its step, instead of a spare that re-runs the whole loop. The job's result stays bitwise
that of a failure-free run."""

from __future__ import annotations

import random

import pytest

from tests.lockstep.lockstep_helpers import Job, assert_bitwise_equal, reference

pytestmark = pytest.mark.slow

SCRIPT, ARGS = "mlp_sampler.py", ["80"]  # 1,280 steps


def wait_for_shadows(job: Job, past_step: int) -> dict:
    return job.wait_status(lambda st: sorted(s["rank"] for s in st["shadows"]) == [0, 1, 2, 3] and
                           min(s["step"] for s in st["shadows"]) >= past_step, f"a shadow per rank past step {past_step}")


def test_a_rank_killed_after_its_shadow_caught_up_is_taken_over_by_it_bitwise(job_factory, tmp_path_factory):
    expected = reference(tmp_path_factory.getbasetemp(), SCRIPT, ARGS)
    job = job_factory(SCRIPT, ARGS, spares=8, env={"LOCKSTEP_SHADOWS": "1"})
    st = wait_for_shadows(job, past_step=random.randrange(20, 200))
    # Four shadows took four of the eight spares; the rest stay for ranks without one.
    assert st["spares"] == 4 and st["spares_used"] == 4
    rank = random.randrange(4)
    before = next(s["step"] for s in job.status()["shadows"] if s["rank"] == rank)
    job.kill_rank(rank)
    assert job.wait() == 0, job.output[-4000:]
    assert_bitwise_equal(job.result(), expected)
    (rec,) = job.recoveries()
    assert rec["rank"] == rank and rec["ok"]
    # The shadow took over from where it had followed the rank to, not from the start.
    assert before <= rec["shadow_step"] <= rec["resumed_at_step"]


def test_without_a_spare_beyond_one_per_rank_no_shadow_is_started(job_factory, tmp_path_factory):
    expected = reference(tmp_path_factory.getbasetemp(), SCRIPT, ARGS)
    job = job_factory(SCRIPT, ARGS, spares=4, env={"LOCKSTEP_SHADOWS": "1"})
    job.wait_step(300)
    st = job.status()
    assert st["shadows"] == [] and st["spares"] == 4
    rank = random.randrange(4)
    job.kill_rank(rank)
    assert job.wait() == 0, job.output[-4000:]
    assert_bitwise_equal(job.result(), expected)
    (rec,) = job.recoveries()
    assert rec["rank"] == rank and rec["shadow_step"] is None
