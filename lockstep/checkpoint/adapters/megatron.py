"""Megatron-Core (0.16): a ``dist_checkpointing`` save strategy whose writes go through lockstep.

Pass it where Megatron takes a sharded save strategy::

    from megatron.core import dist_checkpointing
    from lockstep.checkpoint.adapters.megatron import LockstepSaveStrategy

    strategy = LockstepSaveStrategy()        # keep one: it owns lockstep's writer process
    request = dist_checkpointing.save(sharded_state_dict, ckpt_dir, sharded_strategy=strategy,
                                      async_sharded_save=True)
    async_queue.schedule_async_request(request)   # Megatron's AsyncCallsQueue, as for torch_dist
    ...
    async_queue.maybe_finalize_async_calls()      # metadata.json once every rank's part is published

The checkpoint is Megatron's ``torch_dist`` format (backend ``torch_dist``, version 1):
``common.pt`` and ``metadata.json`` are still Megatron's own, written by Megatron; the sharded
part is DCP files keyed by the sharded keys, as ``TorchDistSaveShardedStrategy`` writes them
(each ShardedTensor's main replica one chunk at its global offset, each ShardedObject's main
replica the ``torch.save`` bytes of ``[data]`` under its unique key). So
``dist_checkpointing.load`` reads it with its default strategy, resharding included, and
``torch.distributed.checkpoint.load`` reads its tensors.

``async_save`` stages this rank's shards into lockstep's shared arena before it returns (the
training loop may change them right away); lockstep's worker process writes them and rank 0
publishes DCP's ``.metadata`` once every rank's part is there. The request's ``async_fn`` (run in
the process Megatron's queue forks or keeps) only waits for that publication, so the queue's
"done" is lockstep's; its finalize function then checks this rank's write and raises
:class:`~lockstep.capture.engine.CaptureFailed` if it failed, before Megatron writes
``metadata.json``, so a checkpoint whose write failed or was killed never looks complete to
Megatron's loader. ``save`` (synchronous) stages and waits for the publication.

Not supported (a ``TypeError`` names the key): ShardedTensors with ``flattened_range`` (the
distributed optimizer's legacy flat layout).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, is_main_replica
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest
from megatron.core.dist_checkpointing.strategies.base import AsyncSaveShardedStrategy

from lockstep.capture.engine import check_tensor
from lockstep.checkpoint import Checkpointer, SaveHandle
from lockstep.checkpoint.checkpointer import object_bytes
from lockstep.checkpoint.format import BYTES, TENSOR, Item
from lockstep.checkpoint.writer import published


class LockstepSaveStrategy(AsyncSaveShardedStrategy):
    """Saves the sharded part of a Megatron checkpoint in ``torch_dist`` format through lockstep."""

    def __init__(self, checkpointer: Checkpointer | None = None):
        super().__init__("torch_dist", 1)
        self.checkpointer = checkpointer or Checkpointer()
        self._object_cache: dict[str, tuple[bytes, bytes]] = {}
        self.last: SaveHandle | None = None  # the latest save's handle (stall_s, wait)

    @property
    def can_handle_sharded_objects(self) -> bool:
        return True

    def save(self, sharded_state_dict, checkpoint_dir: str | Path) -> None:
        self._stage(sharded_state_dict, checkpoint_dir).wait()

    def async_save(self, sharded_state_dict, checkpoint_dir: str | Path) -> AsyncRequest:
        handle = self._stage(sharded_state_dict, checkpoint_dir)
        worker = self.checkpointer.engine.worker_pid
        args = (handle.path, handle.save_id, worker, self.checkpointer.deadline_s)
        return AsyncRequest(wait_published, args, [handle.wait])

    def close(self, *, wait: bool = True) -> None:
        self.checkpointer.close(wait=wait)

    def _stage(self, sharded_state_dict, checkpoint_dir) -> SaveHandle:
        flat = flatten_sharded(sharded_state_dict, self._object_cache)
        self.last = self.checkpointer.save_flat(flat, checkpoint_dir, into=True)
        return self.last


def flatten_sharded(sharded_state_dict, object_cache: dict | None = None):
    """This rank's main replicas as lockstep's DCP items, keyed as ``torch_dist`` keys them."""
    by_key: dict[str, list] = {}
    for sh in nested_values(sharded_state_dict):
        if not isinstance(sh, (ShardedTensor, ShardedObject)):
            raise TypeError(f"expected ShardedTensor or ShardedObject values, got {type(sh).__name__}")
        if is_main_replica(sh.replica_id):
            by_key.setdefault(sh.unique_key if isinstance(sh, ShardedObject) else sh.key, []).append(sh)
    items: list[Item] = []
    tensors: dict[str, Any] = {}
    objects: list[tuple[Item, bytes]] = []
    for key, shards in by_key.items():
        if isinstance(shards[0], ShardedObject):
            # What torch_dist stores for a ShardedObject: torch.save of the list of its data.
            blob = object_bytes(key, [sh.data for sh in shards], object_cache)
            item = Item(key, BYTES, len(blob))
            items.append(item)
            objects.append((item, blob))
            continue
        for sh in shards:  # one per layer of a layer-stacked key, for instance
            if sh.flattened_range is not None:
                raise TypeError(f"{key!r}: ShardedTensors with a flattened_range are not supported")
            # The chunk includes the prepended (layer) axes as size-1 dimensions, as in torch_dist.
            sizes = (1,) * sh.prepend_axis_num + tuple(sh.local_shape)
            data = check_tensor(key, sh.data).reshape(sizes)
            item = Item(key, TENSOR, data.nbytes, data.dtype, tuple(sh.global_shape), tuple(sh.global_offset), sizes)
            items.append(item)
            tensors[item.slot] = data
    return items, tensors, objects, {key: (key,) for key in by_key}


def wait_published(path: str, save_id: str, worker_pid: int | None, deadline_s: float) -> None:
    """The request's ``async_fn``: return once save ``save_id`` is published at ``path``.

    Also returns when lockstep's worker process is gone or after ``deadline_s`` (the writer's
    own bound on waiting for other ranks); the finalize function then tells success from failure.
    """
    deadline = time.monotonic() + deadline_s
    delay = 0.005
    while not published(path, save_id) and _alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(delay)  # polling the checkpoint's filesystem; backs off to 0.1 s
        delay = min(delay * 2, 0.1)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # killed but not yet reaped by the training process: gone


__all__ = ["LockstepSaveStrategy", "flatten_sharded", "wait_published"]
