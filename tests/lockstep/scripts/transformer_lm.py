"""A small causal transformer language model trained with DDP: token embeddings, two encoder
layers with dropout, AdamW, a warm-up + cosine LambdaLR, gradient accumulation with no_sync(),
gradient clipping, a DistributedSampler and an enumerate() loop.
Usage: torchrun --nproc-per-node 4 transformer_lm.py OUT [EPOCHS]"""

import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

VOCAB, CTX, DIM = 64, 16, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(CTX, DIM))
        layer = nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        h = self.body(self.tok(ids) + self.pos[: ids.shape[1]], mask=mask, is_causal=True)
        return self.head(h)


def main():
    out = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(11)
    corpus = torch.randint(0, VOCAB, (512, CTX + 1), generator=g)
    dataset = TensorDataset(corpus[:, :-1], corpus[:, 1:])
    sampler = DistributedSampler(dataset, shuffle=True, seed=5, drop_last=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    torch.manual_seed(1)
    model = TinyLM()
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    accum = 2
    total_steps = epochs * len(loader) // accum
    warmup = 5

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for i, (ids, targets) in enumerate(loader):
            last = (i + 1) % accum == 0
            if last:
                logits = ddp(ids)
                loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)) / accum
                loss.backward()
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            else:
                with ddp.no_sync():
                    logits = ddp(ids)
                    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)) / accum
                    loss.backward()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * accum:.4f}", flush=True)
    if rank == 0:
        torch.save(model.state_dict(), out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
