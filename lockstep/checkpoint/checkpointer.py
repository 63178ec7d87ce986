"""Asynchronous checkpoints in PyTorch DCP's format: the training loop is blocked only while staging.

``save`` flattens the state dict the way DCP does, copies its tensors into the capture engine's
shared arena and returns; the engine's worker process writes this rank's part and (rank 0)
publishes the checkpoint atomically. Files are DCP's own format: ``torch.distributed.checkpoint
.load`` (or :func:`load`) reads them, with resharding, on any number of ranks.

With several ranks (``torch.distributed`` initialized), every rank calls ``save`` with the same
path, as with ``dcp.save``. Per save the ranks exchange one small object over a gloo group of
their own (a save id, a digest of what each rank holds, failures to abandon); the full list of
items is exchanged only when a digest changes (plan caching), and each replicated item is
written by exactly one rank.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import pickle
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from lockstep.capture.engine import CaptureFailed, CaptureHandle, CaptureInFlight, Engine, check_tensor
from lockstep.capture.fsutil import partial_path
from lockstep.checkpoint.format import BYTES, TENSOR, Item, assign_owners, digest
from lockstep.checkpoint.writer import MANIFEST

_SINK = "lockstep.checkpoint.writer:write"


class SaveHandle:
    """A checkpoint that is staged; :meth:`wait` until it is published."""

    def __init__(self, path: str, save_id: str, step: int | None, call_s: float, capture: CaptureHandle | None):
        self.path = path
        self.save_id = save_id
        self.step = step
        self.call_s = call_s  # how long save() itself blocked the caller
        self.capture = capture  # None on a rank that had nothing to write

    @property
    def stall_s(self) -> float:
        """Time the training loop was blocked: the call, plus optimizer steps waiting for overlapped staging."""
        return self.call_s + (self.capture.blocked_s if self.capture is not None else 0.0)

    def done(self) -> bool:
        return self.capture is None or self.capture.done()

    def wait(self, timeout: float | None = None) -> dict:
        """This rank's result once the checkpoint is published; CaptureFailed if it was not."""
        if self.capture is None:
            return {"path": self.path, "save_id": self.save_id, "bytes": 0}
        return self.capture.wait(timeout)

    def __repr__(self) -> str:
        state = "done" if self.done() else "draining"
        return f"<SaveHandle {self.path} step={self.step} stall={self.stall_s * 1e3:.1f}ms {state}>"


class Checkpointer:
    """Saves checkpoints through one capture engine. One per process is enough (see :func:`save`)."""

    def __init__(
        self,
        *,
        process_group: Any = None,
        engine: Engine | None = None,
        deadline_s: float = 600.0,
        checksums: bool = False,
        job_name: str | None = None,
    ):
        """``deadline_s``: how long rank 0 waits for the other ranks' parts (and they for its publish).
        ``checksums``: write the zip CRC32 of every record (DCP's default; costs a pass over the data)."""
        self.engine = engine or Engine(name="lockstep-checkpoint")
        self.engine.start()  # the worker imports torch while training goes on
        self.deadline_s = deadline_s
        self.checksums = checksums
        self.job_name = job_name or os.environ.get("LOCKSTEP_JOB")
        self._user_group = process_group
        self._side_group: Any = None
        self._owners: dict[tuple, int] | None = None
        self._owners_for: tuple[str, ...] | None = None
        self._last: SaveHandle | None = None
        self._object_cache: dict[str, tuple[bytes, bytes]] = {}
        self._lock = threading.Lock()

    # -- public ---------------------------------------------------------------------------------

    def save(
        self,
        state_dict: Mapping[str, Any],
        path: str | os.PathLike,
        *,
        step: int | None = None,
        overwrite: bool = False,
        block: bool = True,
        overlap: bool = False,
    ) -> SaveHandle:
        """Stage ``state_dict`` and return; the write to ``path`` (a directory) goes on in the background.

        ``block=False``: if the previous save is still being written, raise
        :class:`~lockstep.capture.engine.CaptureInFlight` (on every rank) instead of waiting.
        ``overlap=True``: return before the copies are done and let them run beside the next
        forward and backward; the next ``optimizer.step()`` waits for them. For states whose
        tensors change only in optimizer steps (parameters, optimizer state; not BatchNorm
        running statistics, which the forward pass updates).
        """
        return self._save(lambda: _flatten(state_dict, self._object_cache), path, step=step, overwrite=overwrite,
                          block=block, overlap=overlap)

    def save_flat(
        self,
        flat: tuple[list[Item], dict[str, torch.Tensor], list[tuple[Item, bytes]], dict[str, tuple]],
        path: str | os.PathLike,
        *,
        step: int | None = None,
        overwrite: bool = False,
        block: bool = True,
        into: bool = False,
    ) -> SaveHandle:
        """:meth:`save` of a state its framework has already flattened into DCP items.

        ``flat`` is ``(items, tensors, objects, mapping)`` as ``save`` builds it: one
        :class:`~lockstep.checkpoint.format.Item` per tensor chunk (its tensor in ``tensors`` under
        its ``slot``) or object (its ``torch.save`` bytes in ``objects``), and DCP's flatten mapping.
        ``into=True``: ``path`` is an existing directory the framework owns and writes its own files
        to (Megatron-Core's ``common.pt``, ``metadata.json``); the files are moved into it, DCP's
        ``.metadata`` and then the manifest last, instead of the directory being renamed into place
        (so the framework's own marker, written after the handle is done, says it is complete).
        """
        return self._save(lambda: flat, path, step=step, overwrite=overwrite or into, block=block, overlap=False,
                          into=into)

    def _save(self, flatten, path, *, step, overwrite: bool, block: bool, overlap: bool, into: bool = False) -> SaveHandle:
        """One save, under the lock; ``flatten()`` gives its items (timed as part of the stall)."""
        with self._lock:
            started = time.perf_counter()
            path = os.path.abspath(os.fspath(path))
            if not overwrite and os.path.exists(os.path.join(path, ".metadata")):
                raise FileExistsError(f"a checkpoint already exists at {path} (pass overwrite=True to replace it)")
            items, tensors, objects, mapping = flatten()
            rank, world = self._rank_world()
            previous = self._last.capture if self._last is not None else None
            busy = previous is not None and not previous.done()
            if world == 1:
                if busy and not block:
                    raise CaptureInFlight(f"the save to {self._last.path} is still being written")
                save_id, owners = uuid.uuid4().hex, None
            else:
                save_id, owners, any_busy = self._coordinate(items, previous, busy)
                if any_busy and not block:
                    raise CaptureInFlight("a rank's previous save is still being written; skipped on every rank")
            if owners is not None:
                mine = {it.slot for it in items if owners[it.key] == rank}
                tensors = {k: v for k, v in tensors.items() if k in mine}
                objects = [(it, blob) for it, blob in objects if it.slot in mine]
            job = {
                "path": path,
                "partial": partial_path(path, save_id),
                "into": into,
                "rank": rank,
                "world": world,
                "save_id": save_id,
                "step": step,
                "overwrite": overwrite,
                "deadline_s": self.deadline_s,
                "checksums": self.checksums,
                "job_name": self.job_name,
                "tensors": [it for it in items if it.kind == TENSOR and it.slot in tensors],
                "objects": objects,
                "mapping": mapping,
            }
            capture = self.engine.capture(tensors, _SINK, job, block=True, overlap=overlap)
            handle = SaveHandle(path, save_id, step, time.perf_counter() - started, capture)
            self._last = handle
            return handle

    def wait(self, timeout: float | None = None) -> dict | None:
        """Wait for the last save; its result, or None if there was none."""
        last = self._last
        return None if last is None else last.wait(timeout)

    def close(self, *, wait: bool = True) -> None:
        self.engine.close(wait=wait)

    # -- multi-rank ------------------------------------------------------------------------------

    def _rank_world(self) -> tuple[int, int]:
        if not (dist.is_available() and dist.is_initialized()):
            return 0, 1
        group = self._user_group
        return dist.get_rank(group), dist.get_world_size(group)

    def _group(self):
        if self._side_group is None:
            # A gloo group of our own: never interleaves with the job's NCCL/gloo collectives.
            ranks = dist.get_process_group_ranks(self._user_group) if self._user_group is not None else None
            self._side_group = dist.new_group(ranks=ranks, backend="gloo")
        return self._side_group

    def _coordinate(self, items: list[Item], previous: CaptureHandle | None, busy: bool):
        group = self._group()
        world = dist.get_world_size(group)
        failed = previous.id if previous is not None and previous.failed else None
        mine = (uuid.uuid4().hex, digest(items), busy, self._last.save_id if failed else None)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine, group=group)
        save_id = gathered[0][0]
        abandoned = {g[3] for g in gathered if g[3]}
        if previous is not None and self._last.save_id in abandoned and busy:
            # Another rank's part of the previous save is lost: stop waiting for it.
            self.engine.abort(previous)
        digests = tuple(g[1] for g in gathered)
        if digests != self._owners_for:
            lists: list[Any] = [None] * world
            dist.all_gather_object(lists, [(it.key, it.nbytes) for it in items], group=group)
            self._owners, self._owners_for = assign_owners(lists), digests
        return save_id, self._owners, any(g[2] for g in gathered)


def object_bytes(fqn: str, value: Any, cache: dict | None) -> bytes:
    """``torch.save`` bytes of an object (what DCP stores for it), reused while it is unchanged."""
    key = None
    if cache is not None:
        try:
            key = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)  # microseconds for the usual small objects
        except Exception:
            key = None
        hit = cache.get(fqn)
        if key is not None and hit is not None and hit[0] == key:
            return hit[1]
    buf = io.BytesIO()
    torch.save(value, buf)
    blob = buf.getvalue()
    if cache is not None and key is not None:
        cache[fqn] = (key, blob)
    return blob


def _flatten(state_dict: Mapping[str, Any], object_cache: dict | None = None):
    """DCP's flattening (same keys as ``dcp.save``): items, tensors to stage, object blobs, mapping."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
    plain = {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state_dict.items()}
    flat, mapping = flatten_state_dict(plain)
    items: list[Item] = []
    tensors: dict[str, torch.Tensor] = {}
    objects: list[tuple[Item, bytes]] = []
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    for fqn, value in flat.items():
        if isinstance(value, DTensor):
            chunks = value.__create_chunk_list__()
            if len(chunks) != 1:
                raise TypeError(f"{fqn!r}: a DTensor with {len(chunks)} local chunks is not supported")
            local = check_tensor(fqn, value.to_local())
            item = Item(fqn, TENSOR, local.nbytes, value.dtype, tuple(value.shape), tuple(chunks[0].offsets), tuple(chunks[0].sizes))
            items.append(item)
            tensors[item.slot] = local
        elif isinstance(value, ShardedTensor):
            raise TypeError(f"{fqn!r}: ShardedTensor is not supported; use DTensor (FSDP2, torch.distributed.tensor)")
        elif isinstance(value, torch.Tensor):
            value = check_tensor(fqn, value)
            shape = tuple(value.shape)
            item = Item(fqn, TENSOR, value.nbytes, value.dtype, shape, (0,) * len(shape), shape)
            items.append(item)
            tensors[item.slot] = value
        else:
            blob = object_bytes(fqn, value, object_cache)
            item = Item(fqn, BYTES, len(blob))
            items.append(item)
            objects.append((item, blob))
    return items, tensors, objects, mapping


# -- module-level API -----------------------------------------------------------------------------

_default: Checkpointer | None = None
_default_lock = threading.Lock()


def default_checkpointer() -> Checkpointer:
    global _default
    with _default_lock:
        if _default is None:
            _default = Checkpointer()
            # A script that saves and then ends still gets its last checkpoint published.
            atexit.register(_default.close)
        return _default


def save(state_dict: Mapping[str, Any], path: str | os.PathLike, **kwargs) -> SaveHandle:
    """Stage ``state_dict`` and write it to ``path`` in the background (see :meth:`Checkpointer.save`)."""
    return default_checkpointer().save(state_dict, path, **kwargs)


def wait(timeout: float | None = None) -> dict | None:
    """Wait for the last :func:`save` of this process to be published."""
    return default_checkpointer().wait(timeout)


def is_complete(path: str | os.PathLike) -> bool:
    """True for a published checkpoint: DCP's ``.metadata`` is written last, then the directory renamed."""
    return os.path.isfile(os.path.join(os.fspath(path), ".metadata"))


def load(state_dict: dict[str, Any], path: str | os.PathLike, *, process_group: Any = None, strict: bool = True) -> None:
    """Load a checkpoint into ``state_dict`` in place (``torch.distributed.checkpoint.load``).

    Tensors are filled in place, objects replaced in ``state_dict``, ``Stateful`` values get
    ``load_state_dict``. ``strict=False`` leaves keys the checkpoint lacks untouched.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    path = os.fspath(path)
    if not is_complete(path):
        raise FileNotFoundError(f"no complete checkpoint at {path}")
    single = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():
        if single:  # DCP warns that it assumes one process; that is what was asked
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(
            state_dict,
            checkpoint_id=path,
            process_group=process_group,
            planner=DefaultLoadPlanner(allow_partial_load=not strict),
            no_dist=single,
        )


def latest(root: str | os.PathLike) -> str | None:
    """The most recently published checkpoint directly under ``root`` (by its manifest), or None."""
    root = os.fspath(root)
    best: tuple[int, str] | None = None
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return None
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(".") or not is_complete(path):
            continue
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                created = int(json.load(f)["created_ns"])
        except (OSError, ValueError, KeyError):
            created = int(os.stat(os.path.join(path, ".metadata")).st_mtime_ns)
        if best is None or created > best[0]:
            best = (created, path)
    return best[1] if best else None


__all__ = [
    "CaptureFailed",
    "CaptureInFlight",
    "Checkpointer",
    "SaveHandle",
    "default_checkpointer",
    "is_complete",
    "latest",
    "load",
    "save",
    "wait",
]
