"""The benchmark job: a DDP MLP trained for a fixed number of steps on synthetic data made from
(seed, step, rank), so a restarted run can regenerate any step's batch. Rank 0 prints
``STEP <n> <unix time>`` every 20 steps and ``DONE <unix time>`` at the end.

Checkpointing, only for the torchrun-restart baseline (the usual way): ``--ckpt-dir D
--ckpt-every K`` saves model, optimizer and step with torch.distributed.checkpoint every K steps
and loads the latest one at start.

Usage: torchrun --nproc-per-node 4 train.py OUT --steps N [--width W] [--ckpt-dir D --ckpt-every K]
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--ckpt-every", type=int, default=0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    w = args.width
    model = build_model(w)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    start = 0
    if args.ckpt_dir and os.path.exists(os.path.join(args.ckpt_dir, "latest")):
        with open(os.path.join(args.ckpt_dir, "latest")) as f:
            start = int(f.read())
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(args.ckpt_dir, f"step{start}"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    gen = torch.Generator()
    for step in range(start, args.steps):
        gen.manual_seed(step * 1000 + rank)
        torch.manual_seed(step * 7919 + rank)  # dropout: a restarted step draws the same masks
        x = torch.randn(args.batch, 128, generator=gen)
        y = torch.randn(args.batch, 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = step + 1
        if rank == 0 and done % 20 == 0:
            print(f"STEP {done} {time.time():.6f}", flush=True)
        if args.ckpt_every and done % args.ckpt_every == 0 and done < args.steps:
            t0 = time.time()
            path = os.path.join(args.ckpt_dir, f"step{done}")
            dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=path)
            dist.barrier()
            if rank == 0:
                tmp = os.path.join(args.ckpt_dir, "latest.tmp")
                with open(tmp, "w") as f:
                    f.write(str(done))
                os.replace(tmp, os.path.join(args.ckpt_dir, "latest"))
                print(f"CKPT {done} {time.time() - t0:.4f}", flush=True)
    if rank == 0:
        print(f"DONE {time.time():.6f}", flush=True)
        torch.save(model.state_dict(), args.out)
    dist.destroy_process_group()
    # torch 2.13 + gloo can deadlock as main() returns: the main thread, holding the GIL, frees
    # DDP's reducer and so joins gloo's worker thread, which waits for the GIL to free its last
    # work (py-spy --native of a stuck rank, 2026-12-02; it stalled the plain runs). Training
    # is over and the output written: leave without the interpreter's teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
