"""Job snapshots with no code change, end to end (CPU, gloo, 4 ranks, unmodified scripts): a
running ``lockstep run`` job is snapshotted (``lockstep snapshot``), finishes undisturbed, and
``lockstep restore`` of the snapshot finishes with final parameters bitwise equal to a plain
torchrun run of the same script."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time

import pytest

from tests.lockstep.lockstep_helpers import BIN, AgentListener, Job, assert_bitwise_equal, reference

CASES = {
    "mlp_sampler.py": ["20"],  # DistributedSampler epochs, dropout, AdamW, StepLR
    "transformer_lm.py": ["40"],  # gradient accumulation
}


def _snapshot(job: Job) -> dict:
    done = job.cli("snapshot", "--job", job.name, timeout=300)
    assert done.returncode == 0, done.stderr + job.output[-3000:]
    sid = re.match(r"snapshot (\S+) of job", done.stdout).group(1)
    listed = job.cli("snapshots", "--job", job.name, "--json")
    (manifest,) = [m for m in json.loads(listed.stdout) if m["id"] == sid]
    return manifest


@pytest.mark.slow
@pytest.mark.timeout(1200)  # three 4-rank runs of the script (reference, snapshotted, restored)
@pytest.mark.parametrize("script", sorted(CASES))
def test_snapshot_of_a_running_job_restores_bitwise(script, job_factory, tmp_path_factory, tmp_path):
    args = CASES[script]
    expected = reference(tmp_path_factory.getbasetemp(), script, args)
    agent = AgentListener(tmp_path / "agent.sock")
    job = job_factory(script, args, env={"LOCKSTEP_AGENT_SOCKET": agent.path})
    job.wait_step(random.randrange(5, 60))
    manifest = _snapshot(job)
    assert job.wait() == 0, job.output[-4000:]
    # Taking the snapshot did not change the run.
    assert_bitwise_equal(job.result(), expected)

    assert manifest["world_size"] == 4 and manifest["step"] >= 5 and manifest["reason"] == "on demand"
    files = sorted(os.listdir(manifest["path"]))
    assert files == ["manifest.json", "rank0.pt", "rank1.pt", "rank2.pt", "rank3.pt"]
    assert manifest["bytes"] == sum(os.path.getsize(os.path.join(manifest["path"], f"rank{r}.pt")) for r in range(4))
    assert not [n for n in os.listdir(os.path.dirname(manifest["path"])) if n.startswith(".")]
    (event,) = [e for e in agent.events if e["kind"] == "job.snapshot"]
    assert event["data"]["id"] == manifest["id"] and event["data"]["step"] == manifest["step"]
    assert event["data"]["job"] == job.name and event["data"]["bytes"] == manifest["bytes"]

    job.out.unlink()
    restored = job_factory(script, args, name=job.name, subcommand=("restore", "--snapshot", manifest["id"]))
    assert restored.wait() == 0, restored.output[-4000:]
    assert f"restoring from {manifest['path']} at step {manifest['step']}" in restored.output
    assert_bitwise_equal(restored.result(), expected)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_periodic_snapshots_of_a_job(job_factory):
    job = job_factory("mlp_sampler.py", CASES["mlp_sampler.py"], subcommand=("run", "--snapshot-every", "2s"))
    assert job.wait() == 0, job.output[-4000:]
    listed = json.loads(job.cli("snapshots", "--job", job.name, "--json").stdout)
    assert listed, job.output[-3000:]
    steps = [m["step"] for m in listed]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert {m["reason"] for m in listed} == {"scheduled"}


def _cli(tmp_path, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, LOCKSTEP_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([str(BIN / "lockstep"), *args], env=env, capture_output=True, text=True, timeout=120)


def test_restore_of_an_unknown_snapshot_is_refused(tmp_path):
    done = _cli(tmp_path, "restore", "--job", "nojob", "--snapshot", "20260101T000000-abcdef", "--",
                   "torchrun", "--nproc-per-node", "1", "x.py")
    assert done.returncode == 2
    assert "no complete snapshot '20260101T000000-abcdef' of job 'nojob'" in done.stderr
    done = _cli(tmp_path, "run", "--snapshot-every", "soon", "--", "torchrun", "x.py")
    assert done.returncode == 2 and "'soon': a duration like 30s, 5m or 1h" in done.stderr


def test_snapshot_of_a_job_that_is_not_running(tmp_path):
    done = _cli(tmp_path, "snapshot", "--job", "nojob")
    assert done.returncode == 1 and "no running job named 'nojob'" in done.stderr


def test_a_snapshot_ordered_as_the_job_ends_answers_at_once(job_factory, tmp_path):
    # The script's last step is done; it will never reach the hold boundary. Once it ends, the
    # snapshot must say so promptly (it used to wait out the orchestrator's 180 s timeout).
    gate = tmp_path / "gate"
    job = job_factory("waits_before_exit.py", ["8", str(gate)])
    deadline = time.monotonic() + 300
    while "steps done: 8" not in job.output:
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output[-3000:]
        time.sleep(0.05)
    answer = {}

    def order():
        started = time.monotonic()
        answer["done"] = job.cli("snapshot", "--job", job.name, timeout=170)
        answer["after_s"] = time.monotonic() - started

    ordering = threading.Thread(target=order)
    ordering.start()
    # The ranks prepare (they are still running), then never hold: the script has no more steps.
    root = job.state_dir / "snapshots" / job.name
    deadline = time.monotonic() + 120
    while not (root.is_dir() and any(name.startswith(".") for name in os.listdir(root))):
        assert time.monotonic() < deadline and ordering.is_alive(), answer
        time.sleep(0.05)
    ended_at = time.monotonic()
    gate.touch()
    assert job.wait() == 0, job.output[-3000:]
    ordering.join(170)
    done = answer["done"]
    assert done.returncode == 1 and "the job ended before the snapshot was taken" in done.stderr, (done.stdout, done.stderr)
    assert time.monotonic() - ended_at < 60  # answered when the job ended, far inside the 180 s timeout
    assert not os.listdir(root)  # the partial directory is gone
