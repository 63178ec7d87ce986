"""A DDP script with a bug that only rank 1 hits, at step 8. Usage: raises_on_rank1.py OUT"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(400):
    if dist.get_rank() == 1 and step == 8:
        raise ValueError("a bug in the training script")
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if dist.get_rank() == 0:
    torch.save(model.module.state_dict(), sys.argv[1])
