"""Run by tests/capture/test_adapters.py under torchrun (2 gloo ranks) with an interpreter that
has Megatron-Core 0.16 installed.

A GPTModel (Megatron-Core's own, tensor parallel over the 2 ranks: real sharding) with an
iteration counter (common.pt) and a per-rank ShardedObject is saved through LockstepSaveStrategy:

1. asynchronously, with each rank's writer frozen mid-write (LOCKSTEP_CAPTURE_FAULT): the save has
   returned, the checkpoint is not complete and Megatron's queue does not finalize it; once the
   writers go on, the queue finalizes it and metadata.json appears;
2. synchronously, after the weights changed;
3. asynchronously again with the writers killed (kill -9) mid-write: finalizing raises, the
   checkpoint never gets metadata.json, Megatron's load refuses it and the previous one loads.

Fresh models with other weights load 1 and 2 with Megatron's own ``dist_checkpointing.load``:
bitwise equal. ``torch.distributed.checkpoint.load`` reads a sharded tensor of 1 whole.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

FAULT = "LOCKSTEP_CAPTURE_FAULT"

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

# Megatron's AsyncCallsQueue puts its done flags on the current CUDA device and synchronizes CUDA
# before forking; this CPU build of torch has neither, so here they are the CPU and a no-op.
torch.cuda.current_device = lambda: "cpu"
torch.cuda.synchronize = lambda *args, **kwargs: None

from megatron.core import dist_checkpointing, parallel_state  # noqa: E402
from megatron.core.dist_checkpointing.mapping import ShardedObject  # noqa: E402
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from lockstep.capture.engine import CaptureFailed  # noqa: E402
from lockstep.checkpoint.adapters.megatron import LockstepSaveStrategy  # noqa: E402

parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
CONFIG = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True)


def build(seed):
    torch.manual_seed(seed)
    return GPTModel(config=CONFIG, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128, max_sequence_length=32)


def sharded(model, iteration, rng):
    return {
        "model": model.sharded_state_dict(),
        "iteration": iteration,  # not sharded: Megatron writes it to common.pt
        "rng": ShardedObject("rng_state", rng, (world,), (rank,), replica_id=0),
    }


def tensors(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def state_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def until(condition, what, timeout=120.0):
    deadline, delay = time.monotonic() + timeout, 0.005
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def complete(path):
    return os.path.exists(os.path.join(path, "metadata.json"))


def frozen_strategy():
    """A strategy whose writer stops itself after its first bytes of tensor data."""
    os.environ[FAULT] = "stop:data:1"
    strategy = LockstepSaveStrategy()
    del os.environ[FAULT]
    return strategy


def new_dir(name):
    path = os.path.join(sys.argv[1], name)
    if rank == 0:
        os.makedirs(path)  # Megatron saves into an existing directory
    dist.barrier()
    return path


def load_into(seed, path):
    model = build(seed)
    loaded = dist_checkpointing.load(sharded(model, None, None), path)
    model.load_state_dict(loaded["model"])
    return model, loaded


out = {}
queue = AsyncCallsQueue()
model = build(0)
rng = torch.randn(5, generator=torch.Generator().manual_seed(100 + rank))

# 1. Async, writers frozen mid-write.
strategy = frozen_strategy()
first = new_dir("iter_0000001")
expected_first = tensors(model)
request = dist_checkpointing.save(sharded(model, 1, rng), first, sharded_strategy=strategy, async_sharded_save=True)
worker = strategy.checkpointer.engine.worker_pid
until(lambda: state_of(worker) == "T", "the writer to stop mid-write")
queue.schedule_async_request(request)
with torch.no_grad():
    for p in model.parameters():
        p.add_(1.0)  # training goes on right after the save returned: the checkpoint keeps the staged values
dist.barrier()
out["complete_while_writing"] = complete(first) or os.path.exists(os.path.join(first, ".metadata"))
out["finalized_while_writing"] = queue.maybe_finalize_async_calls(blocking=False)
dist.barrier()
os.kill(worker, signal.SIGCONT)
out["finalized"] = queue.maybe_finalize_async_calls(blocking=True)
out["complete_after"] = complete(first)
out["stall_s"] = strategy.last.stall_s

# 2. Sync, after the weights changed.
second = new_dir("iter_0000002")
expected_second = tensors(model)
dist_checkpointing.save(sharded(model, 2, rng), second, sharded_strategy=strategy)
out["sync_complete"] = complete(second)
strategy.close()

# 3. Async, writers killed mid-write.
crashing = frozen_strategy()
third = new_dir("iter_0000003")
request = dist_checkpointing.save(sharded(model, 3, rng), third, sharded_strategy=crashing, async_sharded_save=True)
worker = crashing.checkpointer.engine.worker_pid
until(lambda: state_of(worker) == "T", "the writer to stop mid-write")
queue.schedule_async_request(request)
os.kill(worker, signal.SIGKILL)
try:
    queue.maybe_finalize_async_calls(blocking=True)
    out["crash_finalize"] = "finalized"
except CaptureFailed:
    out["crash_finalize"] = "CaptureFailed"
dist.barrier()
out["crash_complete"] = complete(third)
try:
    load_into(1, third)
    out["crash_load"] = "loaded"
except Exception as exc:  # Megatron: not a distributed checkpoint
    out["crash_load"] = type(exc).__name__
crashing.close(wait=False)

fresh, loaded = load_into(1, first)
out["same_first"] = all(torch.equal(v, tensors(fresh)[k]) for k, v in expected_first.items())
out["iteration_first"] = loaded["iteration"]
out["rng"] = torch.equal(loaded["rng"], rng)
fresh, loaded = load_into(2, second)
out["same_second"] = all(torch.equal(v, tensors(fresh)[k]) for k, v in expected_second.items())
out["iteration_second"] = loaded["iteration"]
out["differs"] = not all(torch.equal(v, expected_second[k]) for k, v in expected_first.items())

# DCP reads the sharded embedding (rows split over the ranks) whole.
whole = {"embedding.word_embeddings.weight": torch.zeros(128, 64)}
dcp.load(whole, checkpoint_id=first, no_dist=True)
mine = expected_first["embedding.word_embeddings.weight"]
rows = mine.shape[0]
out["dcp_slice"] = torch.equal(whole["embedding.word_embeddings.weight"][rank * rows : (rank + 1) * rows], mine)
out["files"] = sorted(os.listdir(first))

results = [None] * world
dist.all_gather_object(results, out)
if rank == 0:
    print(json.dumps({"ranks": results}))
dist.barrier()
dist.destroy_process_group()
