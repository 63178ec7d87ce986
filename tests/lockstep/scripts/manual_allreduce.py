"""No DDP: the script averages its gradients itself, one all_reduce per parameter, after
broadcasting rank 0's initial weights; an LSTM over sequences whose length Python's random
draws per rank, RMSprop, and a barrier every 50 steps.
Usage: torchrun --nproc-per-node 4 manual_allreduce.py OUT [STEPS]"""

import random
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    random.seed(rank)
    np.random.seed(rank)
    torch.manual_seed(rank)
    lstm = nn.LSTM(16, 32, batch_first=True)
    head = nn.Linear(32, 4)
    params = list(lstm.parameters()) + list(head.parameters())
    for p in params:
        dist.broadcast(p.data, src=0)
    opt = torch.optim.RMSprop(params, lr=1e-3)
    for step in range(steps):
        length = random.randint(4, 12)
        x = torch.from_numpy(np.random.randn(8, length, 16).astype("float32"))
        y = torch.randint(0, 4, (8,))
        seq, _ = lstm(x)
        loss = nn.functional.cross_entropy(head(seq[:, -1]), y)
        opt.zero_grad()
        loss.backward()
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        if step % 50 == 0:
            dist.barrier()
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        state = {f"lstm.{k}": v for k, v in lstm.state_dict().items()}
        state.update({f"head.{k}": v for k, v in head.state_dict().items()})
        torch.save(state, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
