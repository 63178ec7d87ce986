"""A DDP training script that opts in to Lockstep's asynchronous checkpoints: every 40 steps it
calls ``lockstep.checkpoint.save``. Usage: torchrun --nproc-per-node 4 mlp_checkpointing.py OUT
EPOCHS CHECKPOINT_DIR"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import lockstep.checkpoint


def main():
    out, epochs, checkpoints = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1024, 24, generator=g)
    y = (x @ torch.randn(24, 3, generator=g)).tanh()
    sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=3)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 96), nn.GELU(), nn.Linear(96, 3))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 40 == 0:
                lockstep.checkpoint.save({"model": model.state_dict(), "optim": opt.state_dict()},
                                         os.path.join(checkpoints, f"step-{step}"), step=step)
    lockstep.checkpoint.save({"model": model.state_dict()}, os.path.join(checkpoints, "final"), step=step).wait()
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
