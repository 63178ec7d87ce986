"""kill -9 during a checkpoint write: the previous checkpoint stays loadable, the new one never
appears complete, and the next save of the same path succeeds and clears the leftovers.

The writer is frozen at a named point of its write (``LOCKSTEP_CAPTURE_FAULT``, it stops itself
with SIGSTOP) so the kill lands exactly there, not wherever a timer happens to fall.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

import lockstep.checkpoint as ckpt
from lockstep.checkpoint import Checkpointer

from .conftest import child_env, process_state, wait_for

TRAINER = r"""
import json, os, sys, torch
from lockstep.checkpoint import Checkpointer

def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(1024, generator=g), "step": seed}

root, point, after, target, overwrite = sys.argv[1:6]
os.environ["LOCKSTEP_CAPTURE_FAULT"] = f"stop:{point}:{after}"
c = Checkpointer()
h = c.save(state(2), os.path.join(root, target), overwrite=overwrite == "1")
print(json.dumps({"worker": c.engine.worker_pid, "staged": True}), flush=True)
h.wait()
print("unreachable: the writer was stopped", flush=True)
"""

STATE_BYTES = (512 * 1024 + 1024) * 4


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(1024, generator=g), "step": seed}


def loaded(path):
    target = {"w": torch.zeros(512, 1024), "b": torch.zeros(1024), "step": -1}
    ckpt.load(target, path)
    return target


def assert_is_state(path, seed):
    got, want = loaded(path), state(seed)
    assert got["step"] == seed
    assert torch.equal(got["w"], want["w"]) and torch.equal(got["b"], want["b"])


@pytest.fixture(scope="module")
def checkpointer():
    c = Checkpointer()
    yield c
    c.close()


@pytest.fixture
def previous(tmp_path, checkpointer):
    checkpointer.save(state(1), tmp_path / "prev").wait(timeout=120)
    return tmp_path / "prev"


def start_trainer(root, point, after, target, overwrite):
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(root), point, str(after), target, "1" if overwrite else "0"],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line, f"trainer exited early ({proc.wait()})"
    worker = json.loads(line)["worker"]
    wait_for(lambda: process_state(worker) == "T", timeout=120, what=f"the writer to stop at {point}")
    return proc, worker


def kill9(*pids):
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def hidden_partials(root):
    return [n for n in os.listdir(root) if n.startswith(".") and ".partial-" in n]


@pytest.mark.parametrize(
    ("point", "after"),
    [("data", 1), ("data", STATE_BYTES // 3), ("data", STATE_BYTES), ("synced", 0), ("metadata", 0), ("publish", 0)],
    ids=["data-first-byte", "data-third", "data-all", "synced", "metadata-tmp", "before-rename"],
)
def test_kill_9_of_trainer_and_writer_mid_write_leaves_previous_intact(tmp_path, previous, checkpointer, point, after):
    proc, worker = start_trainer(tmp_path, point, after, "next", overwrite=False)
    kill9(worker, proc.pid)
    proc.wait()
    wait_for(lambda: process_state(worker) is None, what="the writer to be gone")

    assert_is_state(tmp_path / "prev", 1)
    assert not (tmp_path / "next").exists()
    assert not ckpt.is_complete(tmp_path / "next")
    assert ckpt.latest(tmp_path) == str(tmp_path / "prev")
    assert len(hidden_partials(tmp_path)) == 1  # the interrupted write, invisible to readers

    checkpointer.save(state(3), tmp_path / "next").wait(timeout=120)
    assert_is_state(tmp_path / "next", 3)
    assert hidden_partials(tmp_path) == []


@pytest.mark.parametrize("point", ["metadata", "publish"])
def test_kill_9_while_overwriting_a_checkpoint_keeps_the_old_one_at_its_path(tmp_path, previous, point):
    proc, worker = start_trainer(tmp_path, point, 0, "prev", overwrite=True)
    kill9(worker, proc.pid)
    proc.wait()
    assert_is_state(tmp_path / "prev", 1)


def test_a_staged_checkpoint_is_published_even_if_the_trainer_dies(tmp_path, previous):
    proc, worker = start_trainer(tmp_path, "data", 1, "next", overwrite=False)
    kill9(proc.pid)  # the training process dies after staging; its writer goes on
    proc.wait()
    os.kill(worker, signal.SIGCONT)
    wait_for(lambda: process_state(worker) is None, timeout=120, what="the orphaned writer to finish")
    assert_is_state(tmp_path / "next", 2)
    assert hidden_partials(tmp_path) == []
