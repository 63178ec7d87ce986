"""A loss while the job is recovering from one, and a loss after a recovery whose replacement
is among the survivors (CPU, gloo, 4 ranks, ``kill -9``): the job finishes, bitwise equal to a
failure-free run."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.lockstep.lockstep_helpers import Job, assert_bitwise_equal, reference

pytestmark = pytest.mark.slow

SCRIPT, ARGS = "mlp_sampler.py", ["20"]


def wait_status(job: Job, predicate, what: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.proc.poll() is None, f"the job ended while waiting for {what}:\n{job.output[-3000:]}"
        st = job.status()
        if st and predicate(st):
            return st
        time.sleep(0.02)
    raise AssertionError(f"no {what} in {timeout} s:\n{job.output[-3000:]}")


def rank_of(st: dict, rank: int) -> dict:
    return next(r for r in st["ranks"] if r["rank"] == rank)


@pytest.mark.parametrize("second", ["survivor", "replacement"])
def test_a_second_loss_during_a_recovery_is_recovered_bitwise(second, job_factory, tmp_path_factory):
    """The second ``kill -9`` lands while the first recovery is under way: on a survivor (the
    recovery starts over with both ranks lost) or on the replacement it started (a second
    spare takes its place)."""
    expected = reference(tmp_path_factory.getbasetemp(), SCRIPT, ARGS)
    first, other = random.sample(range(4), 2)
    job = job_factory(SCRIPT, ARGS, spares=3)
    original = rank_of(job.wait_step(random.randrange(10, 60)), first)["pid"]
    job.kill_rank(first)
    if second == "survivor":
        wait_status(job, lambda st: st["busy"] == "recovery", "recovery under way")
        job.kill_rank(other)
        lost = {first, other}
    else:
        st = wait_status(job, lambda st: st["busy"] == "recovery" and rank_of(st, first)["pid"] not in (None, original),
                         "replacement started")
        os.kill(rank_of(st, first)["pid"], signal.SIGKILL)
        lost = {first}
    assert job.wait() == 0, f"ranks {first}, {other}:\n{job.output[-4000:]}"
    assert_bitwise_equal(job.result(), expected)
    assert {r["rank"] for r in job.recoveries()} == lost
    assert all(r["ok"] for r in job.recoveries())


def test_a_loss_after_a_recovery_is_recovered_with_the_replacement_as_a_survivor(job_factory, tmp_path_factory):
    """The first replacement has gone live and is one of the survivors of the second loss: its
    progress is compared with the original ranks' (the same collective numbering)."""
    expected = reference(tmp_path_factory.getbasetemp(), SCRIPT, ARGS)
    first, other = random.sample(range(4), 2)
    job = job_factory(SCRIPT, ARGS, spares=2)
    job.wait_step(random.randrange(10, 40))
    job.kill_rank(first)
    st = wait_status(job, lambda st: st["generation"] == 1 and st["busy"] is None
                     and all(r["status"] == "running" for r in st["ranks"]), "the first recovery to finish")
    job.wait_step(max(r["step"] for r in st["ranks"]) + random.randrange(2, 20))
    job.kill_rank(other)
    assert job.wait() == 0, f"ranks {first}, {other}:\n{job.output[-4000:]}"
    assert_bitwise_equal(job.result(), expected)
    assert [r["rank"] for r in job.recoveries()] == [first, other]
