"""One rank of the audit's collective bandwidth test (torch.distributed), run as a subprocess.

    python collective_worker.py --init tcp://10.0.0.1:29500 --rank 0 --world 2 --backend gloo \\
        --op all_reduce --sizes 1048576,16777216 --iters 20 --warmup 5 [--device cuda:0]

Self-contained on purpose (standard library + torch): it runs under whichever Python has torch
on the node (the training environment), never inside the agent, which does not import torch.
It prints one JSON object: per message size the time of one operation averaged over the
iterations, then averaged over the ranks (nccl-tests' default ``-a 1``), and the slowest rank's.

Sizes follow nccl-tests (``-b``/``-e``): the byte size of the whole buffer, i.e. the all_reduce
and broadcast tensor, all_gather's output, reduce_scatter's input, each rank's alltoall buffer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce")
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _run_op(dist, torch, op: str, size: int, world: int, dtype, device, rank: int):
    elt = torch.tensor([], dtype=dtype).element_size()
    count = max(world, size // elt // world * world)  # divisible by the world, as nccl-tests aligns
    if op == "all_reduce":
        buf = torch.ones(count, dtype=dtype, device=device)
        return count, lambda: dist.all_reduce(buf)
    if op == "broadcast":
        buf = torch.ones(count, dtype=dtype, device=device)
        return count, lambda: dist.broadcast(buf, src=0)
    if op == "reduce":
        buf = torch.ones(count, dtype=dtype, device=device)
        return count, lambda: dist.reduce(buf, dst=0)
    if op == "all_gather":
        out = torch.empty(count, dtype=dtype, device=device)
        inp = torch.ones(count // world, dtype=dtype, device=device)
        if hasattr(dist, "all_gather_into_tensor"):
            try:
                dist.all_gather_into_tensor(out, inp)
                return count, lambda: dist.all_gather_into_tensor(out, inp)
            except (RuntimeError, NotImplementedError):
                pass
        chunks = list(out.chunk(world))
        return count, lambda: dist.all_gather(chunks, inp)
    if op == "reduce_scatter":
        inp = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty(count // world, dtype=dtype, device=device)
        return count, lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "alltoall":
        inp = torch.ones(count, dtype=dtype, device=device)
        out = torch.empty(count, dtype=dtype, device=device)
        return count, lambda: dist.all_to_all_single(out, inp)
    raise ValueError(f"op {op!r}: use one of {', '.join(OPS)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init", required=True, help="init method, tcp://ADDR:PORT")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--op", default="all_reduce", choices=OPS)
    p.add_argument("--sizes", required=True, help="comma-separated byte sizes")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--device", default="cpu", help="cpu or cuda:N")
    p.add_argument("--timeout-s", type=float, default=300.0)
    args = p.parse_args(argv)
    import datetime  # noqa: PLC0415

    import torch  # noqa: PLC0415 - only this subprocess imports torch
    import torch.distributed as dist  # noqa: PLC0415

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    dtype = getattr(torch, args.dtype)
    results = []
    try:
        for size in [int(s) for s in args.sizes.split(",") if s]:
            try:
                count, step = _run_op(dist, torch, args.op, size, args.world, dtype, device, args.rank)
            except (RuntimeError, NotImplementedError, AttributeError) as exc:
                results.append({"size": size, "error": f"{args.op} on {args.backend}: {exc}"})
                continue
            for _ in range(args.warmup):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = (time.perf_counter() - t0) / args.iters
            total = torch.tensor([elapsed], dtype=torch.float64, device=device)
            slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            results.append({"size": count * torch.tensor([], dtype=dtype).element_size(), "count": count,
                            "time_s": float(total.item()) / args.world, "time_s_max": float(slowest.item()),
                            "time_s_rank": elapsed})
    finally:
        dist.destroy_process_group()
    nccl = None
    if args.backend == "nccl":
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    print(json.dumps({"rank": args.rank, "world": args.world, "backend": args.backend, "op": args.op,
                      "dtype": args.dtype, "device": args.device, "torch": torch.__version__, "nccl": nccl,
                      "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
