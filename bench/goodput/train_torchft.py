"""The benchmark job written for torchft 0.2.0 (what torchft asks of a script): the MLP of
``train.py``, one replica group per process, torchft's Manager, DDP and Optimizer wrappers, gloo.
A killed group is restarted by its own ``torchrun --max-restarts`` and heals from a peer
(torchft's checkpoint transport); the others go on meanwhile with one group fewer.

Usage (see torchft_job.py): REPLICA_GROUP_ID=i NUM_REPLICA_GROUPS=n TORCHFT_LIGHTHOUSE=http://...
torchrun --nproc-per-node 1 train_torchft.py OUT --steps N [--width W] [--batch B]
"""

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.nn as nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    group = int(os.environ["REPLICA_GROUP_ID"])
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(128, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Dropout(0.1),
                          nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 16))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"bench_{group}",
                      timeout=timedelta(seconds=10))
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    gen = torch.Generator()
    while manager.current_step() < args.steps:
        step = manager.current_step()
        gen.manual_seed(step * 1000 + group)
        torch.manual_seed(step * 7919 + group)
        x = torch.randn(args.batch, 128, generator=gen)
        y = torch.randn(args.batch, 16, generator=gen)
        opt.zero_grad()  # starts the quorum of this step
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()  # commits only if every group in the quorum succeeded
        done = manager.current_step()
        if done % 20 == 0 and done != step:
            print(f"STEP {done} {time.time():.6f} group {group}", flush=True)
    if group == 0:
        torch.save(model.state_dict(), args.out)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
