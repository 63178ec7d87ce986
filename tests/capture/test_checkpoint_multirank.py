"""Two gloo ranks save one checkpoint (DDP replicas, DTensor shards, a rank-only key): one
process loads it with torch.distributed.checkpoint, every replicated item written exactly once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import torch
from torch.distributed.checkpoint import FileSystemReader

import lockstep.checkpoint as ckpt

from .conftest import child_env

RANK = r"""
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP
import lockstep.checkpoint as ckpt

rank, world, root, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)))
mesh = init_device_mesh("cpu", (world,))
full = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)
state = {
    "model": model.module.state_dict(),
    "sharded": distribute_tensor(full, mesh, [Shard(0)]),
    "replicated": distribute_tensor(full * 2, mesh, [Replicate()]),
    "step": 5,
    f"only{rank}": torch.full((3,), float(rank)),
}
results = [ckpt.save(state, os.path.join(root, name), step=5).wait(timeout=120) for name in ("a", "b")]
print(json.dumps({"rank": rank, "bytes": [r["bytes"] for r in results]}), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_write_one_checkpoint_that_one_process_loads(tmp_path):
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), "2", str(tmp_path), port], env=child_env(), stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    per_rank = {json.loads(o)["rank"]: json.loads(o)["bytes"] for o in outs}

    torch.manual_seed(0)
    expected_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)).state_dict()
    full = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)
    for name in ("a", "b"):
        target = {
            "model": {k: torch.zeros_like(v) for k, v in expected_model.items()},
            "sharded": torch.zeros(64, 8),
            "replicated": torch.zeros(64, 8),
            "step": 0,
            "only0": torch.zeros(3),
            "only1": torch.zeros(3),
        }
        ckpt.load(target, tmp_path / name)
        for k, v in expected_model.items():
            assert torch.equal(target["model"][k], v), k
        assert torch.equal(target["sharded"], full) and torch.equal(target["replicated"], full * 2)
        assert target["step"] == 5
        assert torch.equal(target["only0"], torch.zeros(3)) and torch.equal(target["only1"], torch.ones(3))

        md = FileSystemReader(str(tmp_path / name)).read_metadata()
        entries: dict[str, list] = {}
        for index, info in md.storage_data.items():
            entries.setdefault(index.fqn, []).append(info.relative_path)
        assert len(entries["sharded"]) == 2  # a chunk from each rank
        assert all(len(v) == 1 for k, v in entries.items() if k != "sharded")  # replicated: written once
        assert {p for v in entries.values() for p in v} == {"__0_0.distcp", "__1_0.distcp"}

    state_bytes = sum(v.nbytes for v in expected_model.values()) + 2 * full.nbytes + 2 * 12
    for i in range(2):
        assert per_rank[0][i] + per_rank[1][i] == state_bytes  # nothing written twice
        assert per_rank[0][i] > 0 and per_rank[1][i] > 0  # and both ranks took a share
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
