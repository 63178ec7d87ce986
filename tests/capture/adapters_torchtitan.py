"""Run by tests/capture/test_adapters.py under torchrun (2 gloo ranks) with an interpreter that
has TorchTitan 0.3 installed.

A TorchTitan CheckpointManager (the lockstep one) saves asynchronously every 2 steps, purges to
the latest 2, and a fresh manager on a fresh model loads the latest step bitwise.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from lockstep.checkpoint.adapters.torchtitan import LockstepCheckpointManager, SaveFuture


class Optimizers(Stateful):
    def __init__(self, model, optim):
        self.model, self.optim = model, optim

    def state_dict(self):
        return get_optimizer_state_dict(self.model, self.optim)

    def load_state_dict(self, sd):
        set_optimizer_state_dict(self.model, self.optim, sd)


class Schedulers(Stateful):
    def __init__(self, sched):
        self.sched = sched

    def state_dict(self):
        return {"sched": self.sched.state_dict()}

    def load_state_dict(self, sd):
        self.sched.load_state_dict(sd["sched"])


class TrainState(Stateful):
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, sd):
        self.step = int(sd["step"])


def build(folder, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.9)
    train = TrainState()
    config = LockstepCheckpointManager.Config(enable=True, folder="ck", interval=2, async_mode=sys.argv[2], keep_latest_k=2)
    mgr = LockstepCheckpointManager(
        config,
        dataloader=None,
        model_parts=[model],
        optimizers=Optimizers(model, optim),
        lr_schedulers=Schedulers(sched),
        states={"train_state": train},
        sd_adapter=None,
        base_folder=folder,
    )
    return model, optim, sched, train, mgr


dist.init_process_group("gloo")
folder = sys.argv[1]
model, optim, sched, train, mgr = build(folder, 0)
futures = []
for step in range(1, 7):
    optim.zero_grad()
    torch.manual_seed(step)  # the same batch on both ranks: replicas stay identical
    model(torch.randn(8, 16)).pow(2).mean().backward()
    mgr.maybe_wait_for_staging()
    optim.step()
    sched.step()
    train.step = step
    mgr.save(step)
    futures.append(type(mgr.save_future).__name__ if mgr.save_future is not None else None)
mgr.maybe_wait_for_saving()
mgr.close()

model2, optim2, sched2, train2, mgr2 = build(folder, 1)
assert mgr2.load(step=-1)
same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True))
s1, s2 = optim.state_dict()["state"], optim2.state_dict()["state"]
same_optim = all(torch.equal(s1[k][n], s2[k][n]) for k in s1 for n in s1[k])
if dist.get_rank() == 0:
    print(json.dumps({"futures": futures, "loaded_step": train2.step, "same_model": same, "same_optim": same_optim,
                      "sched": sched2.state_dict()["last_epoch"], "future_type": SaveFuture.__name__}))
mgr2.close()
dist.destroy_process_group()
