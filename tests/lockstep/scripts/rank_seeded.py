"""Each rank seeds its generators differently and makes its own data every step (no
DataLoader): torch, NumPy and Python's random all feed the batch. A step-counted loop, SGD with
momentum and OneCycleLR, BatchNorm (buffers DDP broadcasts) and dropout.
Usage: torchrun --nproc-per-node 4 rank_seeded.py OUT [STEPS]"""

import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 240
    dist.init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)
    torch.manual_seed(1000 + rank)
    np.random.seed(2000 + rank)
    random.seed(3000 + rank)
    target = torch.linspace(-1, 1, 16)
    for step in range(steps):
        x = torch.randn(32, 16) + torch.from_numpy(np.random.randn(32, 16).astype("float32")) * 0.1
        x = x * random.uniform(0.5, 1.5)
        y = (x @ target).unsqueeze(1) + 0.1 * torch.randn(32, 1)
        loss = nn.functional.smooth_l1_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if rank == 0 and step % 60 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
