"""An ordinary DDP training script: MLP, AdamW, StepLR, dropout, a DistributedSampler, gradient
clipping, an epoch loop. Usage: torchrun --nproc-per-node 4 mlp_sampler.py OUT [EPOCHS]"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    out = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1024, 24, generator=g)
    w = torch.randn(24, 3, generator=g)
    y = (x @ w).tanh() + 0.05 * torch.randn(1024, 3, generator=g)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 96), nn.GELU(), nn.Dropout(0.2), nn.Linear(96, 96), nn.GELU(),
                          nn.Dropout(0.2), nn.Linear(96, 3))
    ddp = DDP(model, bucket_cap_mb=0.01)  # several gradient buckets: failures inside backward
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            loss = nn.functional.mse_loss(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            opt.step()
            sched.step()
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch} loss {total / len(loader):.5f}", flush=True)
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
