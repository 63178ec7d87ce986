"""lockstep.checkpoint: async saves that torch.distributed.checkpoint.load reads back bitwise."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import lockstep.checkpoint as ckpt
from lockstep.checkpoint import Checkpointer


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 64))
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.calls += 1
        return self.head(self.norm(self.body(x)))


def trained(seed: int = 0, steps: int = 3):
    torch.manual_seed(seed)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    for _ in range(steps):
        optim.zero_grad()
        model(torch.randn(8, 32)).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
    return model, optim, sched


def fresh():
    torch.manual_seed(99)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
    return model, optim, sched


def full_state(model, optim, sched, step):
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd, "sched": sched.state_dict(), "step": step, "rng": torch.get_rng_state(), "extra": {"tokens": [1, 2, 3]}}


def assert_same_tensors(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture
def checkpointer():
    c = Checkpointer()
    yield c
    c.close()


def test_a_checkpoint_loads_with_dcp_into_a_fresh_model_bitwise(tmp_path, checkpointer):
    model, optim, sched = trained()
    path = tmp_path / "step-3"
    saved = full_state(model, optim, sched, 3)
    handle = checkpointer.save(saved, path, step=3)
    result = handle.wait(timeout=120)
    assert result["bytes"] > 0 and ckpt.is_complete(path)

    model2, optim2, sched2 = fresh()
    msd, osd = get_state_dict(model2, optim2)
    target = {"model": msd, "optim": osd, "sched": sched2.state_dict(), "step": 0, "rng": torch.zeros_like(torch.get_rng_state()), "extra": {"tokens": []}}
    dcp.load(target, checkpoint_id=str(path))
    set_state_dict(model2, optim2, model_state_dict=target["model"], optim_state_dict=target["optim"])
    sched2.load_state_dict(target["sched"])

    assert_same_tensors(model.state_dict(), model2.state_dict())
    s1, s2 = optim.state_dict(), optim2.state_dict()
    assert s1["param_groups"] == s2["param_groups"]
    for pid in s1["state"]:
        assert_same_tensors(s1["state"][pid], s2["state"][pid])
    assert sched2.state_dict() == sched.state_dict()
    assert target["step"] == 3 and target["extra"] == {"tokens": [1, 2, 3]}
    assert torch.equal(target["rng"], saved["rng"])


def test_the_files_have_the_keys_and_chunks_dcp_save_writes(tmp_path, checkpointer):
    model, optim, sched = trained()
    state = full_state(model, optim, sched, 3)
    dcp.save(state, checkpoint_id=str(tmp_path / "by-dcp"))
    checkpointer.save(state, tmp_path / "by-lockstep").wait(timeout=120)
    theirs = FileSystemReader(str(tmp_path / "by-dcp")).read_metadata()
    ours = FileSystemReader(str(tmp_path / "by-lockstep")).read_metadata()
    assert ours.state_dict_metadata.keys() == theirs.state_dict_metadata.keys()
    for key, md in theirs.state_dict_metadata.items():
        mine = ours.state_dict_metadata[key]
        assert type(mine) is type(md), key
        if hasattr(md, "size"):
            assert (mine.size, mine.properties.dtype, mine.chunks) == (md.size, md.properties.dtype, md.chunks), key
    assert ours.planner_data == theirs.planner_data
    assert set(ours.storage_data) == set(theirs.storage_data)


def test_save_returns_once_staged_and_later_changes_are_not_in_the_checkpoint(tmp_path, checkpointer):
    model, optim, sched = trained()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    handle = checkpointer.save({"model": model}, tmp_path / "c")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3.0)  # the training loop moves on at once
    handle.wait(timeout=120)
    model2, _, _ = fresh()
    ckpt.load({"model": model2}, tmp_path / "c")
    assert_same_tensors(before, model2.state_dict())
    assert handle.stall_s > 0 and handle.capture.staged_s <= handle.stall_s


def test_module_level_save_wait_latest_and_manifest(tmp_path):
    model, optim, sched = trained()
    for step in (1, 2, 3):
        ckpt.save({"model": model, "step": step}, tmp_path / f"step-{step}", step=step)
    assert ckpt.wait(timeout=120)["path"] == str(tmp_path / "step-3")
    assert ckpt.latest(tmp_path) == str(tmp_path / "step-3")
    with open(tmp_path / "step-2" / "lockstep.json") as f:
        manifest = json.load(f)
    assert manifest["step"] == 2 and manifest["world_size"] == 1
    assert manifest["tensor_bytes"] == sum(t.nbytes for t in model.state_dict().values())
    assert sorted(os.listdir(tmp_path)) == ["step-1", "step-2", "step-3"]  # no partial left


def test_an_existing_checkpoint_is_refused_unless_overwrite(tmp_path, checkpointer):
    model, optim, sched = trained()
    checkpointer.save({"model": model}, tmp_path / "c").wait(timeout=120)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        checkpointer.save({"model": model}, tmp_path / "c")
    with torch.no_grad():
        model.head.weight.fill_(0.5)
    checkpointer.save({"model": model}, tmp_path / "c", overwrite=True).wait(timeout=120)
    model2, _, _ = fresh()
    ckpt.load({"model": model2}, tmp_path / "c")
    assert torch.equal(model2.head.weight, torch.full_like(model2.head.weight, 0.5))
    assert sorted(os.listdir(tmp_path)) == ["c"]


def test_load_refuses_what_is_not_a_complete_checkpoint(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "__0_0.distcp").write_bytes(b"partial")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        ckpt.load({"x": torch.zeros(1)}, tmp_path / "half")
    with pytest.raises(FileNotFoundError):
        ckpt.load({"x": torch.zeros(1)}, tmp_path / "absent")
    assert ckpt.latest(tmp_path) is None


def test_bad_state_dicts_are_refused_before_anything_is_written(tmp_path, checkpointer):
    with pytest.raises(TypeError, match="mapping"):
        checkpointer.save([torch.zeros(2)], tmp_path / "c")
    with pytest.raises(TypeError, match="'w'.*sparse"):
        checkpointer.save({"w": torch.eye(2).to_sparse()}, tmp_path / "c")
    assert not os.listdir(tmp_path)
