"""Pure planning of a checkpoint in PyTorch DCP's on-disk format (data in, data out, no I/O).

A DCP checkpoint directory holds data files (``__<rank>_<n>.distcp``: each tensor chunk one
``torch.save`` record, each Python object its ``torch.save`` bytes) and ``.metadata``, a pickled
``torch.distributed.checkpoint.metadata.Metadata`` naming, for every flattened key, its global
size and chunks and where each chunk's bytes are. We build that ``Metadata`` with DCP's own
classes, so ``torch.distributed.checkpoint.load`` reads what we write.

Multi-rank semantics are DCP's: plain tensors and objects are replicated (every rank has the
same), a DTensor contributes its local chunk; an item held by several ranks is written once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

TENSOR = "tensor"
BYTES = "bytes"


@dataclass(frozen=True)
class Item:
    """One entry of one rank's flattened state dict: a tensor chunk or an object."""

    fqn: str
    kind: str  # TENSOR or BYTES
    nbytes: int
    dtype: torch.dtype | None = None
    size: tuple[int, ...] = ()  # global size of the tensor
    offsets: tuple[int, ...] = ()  # where this chunk starts in it
    sizes: tuple[int, ...] = ()  # the chunk's own size

    @property
    def slot(self) -> str:
        """The name its tensor is staged under: one per chunk (a rank may hold several of a tensor)."""
        return f"{self.fqn}@{','.join(map(str, self.offsets))}" if self.kind == TENSOR else self.fqn

    @property
    def key(self) -> tuple[str, tuple[int, ...] | None]:
        """Two ranks holding items with the same key hold the same bytes (DCP's dedup key)."""
        return (self.fqn, self.offsets if self.kind == TENSOR else None)


@dataclass(frozen=True)
class Written:
    """Where an item's bytes ended up: file relative to the checkpoint, offset, length."""

    item: Item
    relative_path: str
    offset: int
    length: int


class CheckpointFormatError(ValueError):
    """The parts of a checkpoint do not make a loadable whole."""


def digest(items: list[Item]) -> str:
    """Changes whenever which items a rank holds changes (not their values)."""
    h = hashlib.blake2b(digest_size=16)
    for it in items:
        h.update(f"{it.fqn}\0{it.kind}\0{it.dtype}\0{it.size}\0{it.offsets}\0{it.sizes}\0".encode())
    return h.hexdigest()


def assign_owners(per_rank: list[list[tuple[tuple, int]]]) -> dict[tuple, int]:
    """Which rank writes each item key, given every rank's ``(key, nbytes)`` list.

    An item held by one rank is written by it; one held by several (replicated) goes to the
    least-loaded holder, largest items first, ties to the lowest rank. Deterministic, so every
    rank computes the same answer from the same gathered lists.
    """
    holders: dict[tuple, list[int]] = {}
    size: dict[tuple, int] = {}
    for rank, items in enumerate(per_rank):
        for key, nbytes in items:
            holders.setdefault(key, []).append(rank)
            size[key] = max(size.get(key, 0), nbytes)
    load = [0] * len(per_rank)
    owner: dict[tuple, int] = {}
    for key, ranks in holders.items():
        if len(ranks) == 1:
            owner[key] = ranks[0]
            load[ranks[0]] += size[key]
    shared = sorted((k for k, r in holders.items() if len(r) > 1), key=lambda k: (-size[k], str(k)))
    for key in shared:
        best = min(holders[key], key=lambda r: (load[r], r))
        owner[key] = best
        load[best] += size[key]
    return owner


def build_metadata(
    written: list[Written],
    mapping: dict[str, tuple],
    *,
    checkpoint_id: str,
    save_id: str,
) -> Metadata:
    """The ``.metadata`` of a checkpoint made of ``written`` items (all ranks' parts together)."""
    by_fqn: dict[str, list[Written]] = {}
    for w in written:
        by_fqn.setdefault(w.item.fqn, []).append(w)
    state_dict_metadata = {}
    storage_data = {}
    for fqn, ws in by_fqn.items():
        kinds = {w.item.kind for w in ws}
        if len(kinds) != 1:
            raise CheckpointFormatError(f"{fqn!r} is a tensor on some ranks and an object on others")
        if kinds == {BYTES}:
            state_dict_metadata[fqn] = BytesStorageMetadata()
            w = ws[0]
            storage_data[MetadataIndex(fqn)] = _StorageInfo(w.relative_path, w.offset, w.length)
            continue
        first = ws[0].item
        chunks = []
        seen: set[tuple[int, ...]] = set()
        for w in sorted(ws, key=lambda w: w.item.offsets):
            it = w.item
            if it.dtype != first.dtype or it.size != first.size:
                raise CheckpointFormatError(
                    f"{fqn!r}: ranks disagree on dtype/size ({first.dtype} {list(first.size)} vs {it.dtype} {list(it.size)})"
                )
            if it.offsets in seen:
                continue  # the same chunk from two ranks (written twice when layouts differed)
            seen.add(it.offsets)
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(it.offsets), sizes=torch.Size(it.sizes)))
            storage_data[MetadataIndex(fqn, it.offsets, len(chunks) - 1)] = _StorageInfo(w.relative_path, w.offset, w.length)
        _check_coverage(fqn, first.size, chunks)
        state_dict_metadata[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=first.dtype),
            size=torch.Size(first.size),
            chunks=chunks,
        )
    missing = sorted(set(mapping) - set(state_dict_metadata))
    if missing:
        raise CheckpointFormatError(f"no rank wrote {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return Metadata(
        state_dict_metadata=state_dict_metadata,
        planner_data={k: mapping[k] for k in state_dict_metadata},
        storage_data=storage_data,
        storage_meta=StorageMeta(checkpoint_id=checkpoint_id, save_id=save_id),
        version=CURRENT_DCP_VERSION,
    )


def _volume(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def _check_coverage(fqn: str, size: tuple[int, ...], chunks: list[ChunkStorageMetadata]) -> None:
    """The chunks of a tensor tile it exactly: inside its bounds, not overlapping, nothing missing."""
    for c in chunks:
        if len(c.offsets) != len(size) or any(o < 0 or o + s > n for o, s, n in zip(c.offsets, c.sizes, size, strict=True)):
            raise CheckpointFormatError(f"{fqn!r}: chunk at {list(c.offsets)} of size {list(c.sizes)} is outside {list(size)}")
    for i, a in enumerate(chunks):
        for b in chunks[i + 1 :]:
            overlap = all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True))
            if overlap and _volume(a.sizes) and _volume(b.sizes):
                raise CheckpointFormatError(f"{fqn!r}: chunks at {list(a.offsets)} and {list(b.offsets)} overlap")
    covered = sum(_volume(c.sizes) for c in chunks)
    if covered != _volume(size):
        raise CheckpointFormatError(f"{fqn!r}: chunks cover {covered} of {_volume(size)} elements (a rank's part is missing)")
