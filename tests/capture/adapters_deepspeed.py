"""Run by tests/capture/test_adapters.py with an interpreter that has DeepSpeed 0.19 installed.

A DeepSpeed engine (ZeRO stage 1, CPU, gloo) saves through LockstepCheckpointEngine; the call
returns before anything is written, the files appear at the next optimizer boundaries, ``latest``
only once they are complete, and a fresh engine loads them bitwise (DeepSpeed's own loader).
"""

import json
import os
import socket
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

import deepspeed  # noqa: E402
import deepspeed.comm.torch  # noqa: E402
import torch  # noqa: E402

from lockstep.checkpoint.adapters.deepspeed import LockstepCheckpointEngine  # noqa: E402

# DeepSpeed's optional shared-memory all-reduce for CPU is JIT-compiled (minutes of C++ here);
# the checkpoint engine does not use it, gloo does the collectives.
sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None  # (deepspeed.comm.torch is torch itself)
deepspeed.init_distributed(dist_backend="gloo")
CONFIG = {"train_batch_size": 4, "zero_optimization": {"stage": 1}, "steps_per_print": 1000}


def build(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optim, config=CONFIG)
    engine.checkpoint_engine = LockstepCheckpointEngine()
    return engine


def train(engine, steps):
    for _ in range(steps):
        loss = engine(torch.randn(4, 16)).pow(2).mean()
        engine.backward(loss)
        engine.step()


save_dir = sys.argv[1]
engine = build(0)
train(engine, 3)
expected = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
engine.save_checkpoint(save_dir, tag="step3")
files_right_after = sorted(os.listdir(os.path.join(save_dir, "step3")))
latest_right_after = os.path.exists(os.path.join(save_dir, "latest"))
train(engine, 1)  # this step's optimizer boundary stages the files (before the weights change)
steps = 1
deadline = time.monotonic() + 180  # the first write also imports DeepSpeed in the worker
while not os.path.exists(os.path.join(save_dir, "latest")) and time.monotonic() < deadline:
    train(engine, 1)  # training goes on; a later boundary commits once the files are published
    steps += 1
files = sorted(os.listdir(os.path.join(save_dir, "step3")))
stall = engine.checkpoint_engine.last_stall_s
engine.checkpoint_engine.cleanup()

fresh = build(1)
path, client = fresh.load_checkpoint(save_dir)
same = all(torch.equal(v, fresh.module.state_dict()[k]) for k, v in expected.items())
with open(os.path.join(save_dir, "latest")) as f:
    latest = f.read()
print(json.dumps({"files_right_after": files_right_after, "latest_right_after": latest_right_after, "files": files,
                  "latest": latest, "loaded": path is not None,
                  "same_model": same, "global_steps": fresh.global_steps, "stall_s": stall, "steps_to_publish": steps}))
fresh.checkpoint_engine.cleanup()
