"""Training plus a point-to-point ring exchange every step (send/recv). Usage: p2p_ring.py OUT"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2000):
    token = torch.tensor([float(step)])
    if rank % 2 == 0:
        dist.send(token, (rank + 1) % world)
        dist.recv(token, (rank - 1) % world)
    else:
        dist.recv(token, (rank - 1) % world)
        dist.send(token, (rank + 1) % world)
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if rank == 0:
    torch.save(model.module.state_dict(), sys.argv[1])
