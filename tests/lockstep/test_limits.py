"""What Lockstep cannot protect it says, and then the job fails as it would under torchrun:
promptly, with the reason, never a hang."""

from __future__ import annotations

import subprocess

import pytest

from tests.lockstep.lockstep_helpers import BIN

pytestmark = pytest.mark.slow


def test_with_no_spare_left_a_lost_rank_fails_the_job_and_says_why(job_factory):
    job = job_factory("mlp_sampler.py", ["20"], spares=0)
    job.wait_step(5)
    job.kill_rank(2)
    assert job.wait(120) == 1
    assert "no spare left for rank 2" in job.output


def test_a_script_that_raises_fails_the_job_naming_the_rank(job_factory):
    job = job_factory("raises_on_rank1.py", [])
    assert job.wait(300) == 1
    assert "ValueError: a bug in the training script" in job.output
    assert "rank 1 exited with status 1" in job.output


def test_point_to_point_traffic_is_reported_and_a_loss_then_fails_clearly(job_factory):
    job = job_factory("p2p_ring.py", [])
    job.wait_step(5)
    assert "not protected from hard failures: rank" in job.output and "point-to-point" in job.output
    job.kill_rank(3)
    assert job.wait(120) == 1
    assert "cannot recover: the job is not protected" in job.output


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--", "torchrun", "--nnodes", "1:2", "t.py"], "elastic node counts are not supported"),
    (["run", "--spares", "-1", "--", "torchrun", "t.py"], "--spares -1"),
    (["run", "--scheduler", "pbs", "--", "torchrun", "t.py"], "--scheduler 'pbs'"),
    (["run", "--job", "bad name!", "--", "torchrun", "t.py"], "--job: job name 'bad name!'"),
    (["migrate", "--job", "no-such-job", "--rank", "0"], "no running job named 'no-such-job'"),
])
def test_bad_input_is_refused_naming_what_is_wrong(tmp_path, argv, message):
    proc = subprocess.run([str(BIN / "lockstep"), *argv], capture_output=True, text=True, timeout=120,
                          env={"LOCKSTEP_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode in (1, 2)
    assert message in proc.stderr
