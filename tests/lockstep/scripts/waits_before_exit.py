"""A few DDP steps, then no more steps until the file GATE exists (evaluation, an upload: a
script that is still running but will never reach another step boundary), then exit.
Usage: torchrun --nproc-per-node 4 waits_before_exit.py OUT STEPS GATE"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    out, steps, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(steps):
        loss = ddp(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if int(os.environ["RANK"]) == 0:
        print(f"steps done: {steps}", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.05)
    if int(os.environ["RANK"]) == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
