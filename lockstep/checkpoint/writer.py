"""The checkpoint sink: runs in the capture worker and writes one rank's part of a DCP checkpoint.

Order of a write (each step's fault point in brackets, see ``lockstep.capture.faults``):

1. every tensor chunk and object of this rank into ``__<rank>_0.distcp`` inside the hidden
   partial directory, one ``torch.save`` record per tensor read straight from the arena [data];
   fsync [synced];
2. single rank: go to 4. Several ranks: this rank's part list ``__<rank>.lockstep-part``
   (written atomically); rank 0 waits for every rank's part, the others wait for the publish;
3. rank 0 merges the parts into DCP's ``Metadata`` (checking the chunks tile every tensor);
4. ``lockstep.json`` (the manifest: save id, step, sizes), then ``.metadata`` via a temporary
   name, fsynced, renamed [metadata] — DCP's marker of a complete checkpoint comes last;
5. the partial directory is fsynced and renamed to the checkpoint's path, the parent fsynced
   [publish]; leftovers of interrupted saves of the same path are removed. With ``into`` (a
   directory a framework owns, Megatron-Core's) the files are moved into the existing path
   instead, ``.metadata`` and then the manifest last (``fsutil.publish_into``).

A crash anywhere before 5 leaves only the hidden partial directory: the path shows the previous
checkpoint or nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import time

import torch

from lockstep.capture.fsutil import (
    fsync_dir,
    publish_dir,
    publish_into,
    remove_stale_partials,
    write_file_atomic,
)
from lockstep.checkpoint.format import Written, build_metadata

MANIFEST = "lockstep.json"
MANIFEST_FORMAT = "lockstep.checkpoint/1"


class CheckpointAborted(RuntimeError):
    pass


def _part_name(rank: int) -> str:
    return f"__{rank}.lockstep-part"


def write(job: dict, tensors: dict[str, torch.Tensor], ctx) -> dict:
    started = time.monotonic()
    # The zip CRC of each record costs ~2 s/GB here (one core); completeness is guaranteed by
    # fsync + rename instead. Checksums on: Checkpointer(checksums=True).
    torch.serialization.set_crc32_options(bool(job.get("checksums")))
    partial, rank, world = job["partial"], job["rank"], job["world"]
    os.makedirs(partial, exist_ok=True)
    data_file = f"__{rank}_0.distcp"
    written: list[Written] = []
    data_bytes = 0
    with open(os.path.join(partial, data_file), "wb") as f:
        for item, blob in job["objects"]:
            offset = f.tell()
            f.write(blob)
            written.append(Written(item, data_file, offset, len(blob)))
        for item in job["tensors"]:
            offset = f.tell()
            torch.save(tensors[item.slot], f)
            length = f.tell() - offset
            written.append(Written(item, data_file, offset, length))
            data_bytes += item.nbytes
            ctx.fault("data", data_bytes)
        f.flush()
        os.fsync(f.fileno())
        # Durable now: drop it from the page cache rather than crowd out the training job's memory.
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    ctx.fault("synced")
    write_s = time.monotonic() - started

    if world == 1:
        _finish(job, written, job["mapping"], ctx, started)
    elif rank == 0:
        write_file_atomic(os.path.join(partial, _part_name(0)), pickle.dumps((written, job["mapping"])))
        parts = _wait_for_parts(job, ctx)
        all_written = [w for ws, _ in parts for w in ws]
        mapping = {}
        for _, m in parts:
            mapping.update(m)
        for r in range(world):
            os.unlink(os.path.join(partial, _part_name(r)))
        _finish(job, all_written, mapping, ctx, started)
    else:
        write_file_atomic(os.path.join(partial, _part_name(rank)), pickle.dumps((written, job["mapping"])))
        _wait_for_publish(job, ctx)
    return {
        "path": job["path"],
        "save_id": job["save_id"],
        "rank": rank,
        "bytes": data_bytes,
        "write_s": write_s,
        "duration_s": time.monotonic() - started,
    }


def _poll(job: dict, ctx, ready, what: str) -> None:
    deadline = time.monotonic() + job["deadline_s"]
    delay = 0.005
    while not ready():
        if ctx.aborted():
            raise CheckpointAborted(f"save {job['save_id']} abandoned while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"save {job['save_id']}: {what} not there after {job['deadline_s']} s")
        time.sleep(delay)  # polling a shared filesystem; backs off to 0.2 s
        delay = min(delay * 2, 0.2)


def _wait_for_parts(job: dict, ctx) -> list[tuple[list[Written], dict]]:
    names = [os.path.join(job["partial"], _part_name(r)) for r in range(job["world"])]
    _poll(job, ctx, lambda: all(os.path.exists(n) for n in names), "every rank's part")
    parts = []
    for n in names:
        with open(n, "rb") as f:
            parts.append(pickle.load(f))  # noqa: S301 - written by this job's own workers
    return parts


def published(path: str, save_id: str) -> bool:
    """True once rank 0 has published save ``save_id`` at ``path`` (its manifest is there)."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            return json.load(f).get("save_id") == save_id
    except (OSError, ValueError):
        return False


def _wait_for_publish(job: dict, ctx) -> None:
    _poll(job, ctx, lambda: published(job["path"], job["save_id"]), "rank 0 to publish")


def _finish(job: dict, written: list[Written], mapping: dict, ctx, started: float) -> None:
    partial, path = job["partial"], job["path"]
    metadata = build_metadata(written, mapping, checkpoint_id=path, save_id=job["save_id"])
    tensor_items = [w.item for w in written if w.item.kind == "tensor"]
    manifest = {
        "format": MANIFEST_FORMAT,
        "save_id": job["save_id"],
        "step": job.get("step"),
        "world_size": job["world"],
        "created_ns": time.time_ns(),
        "tensor_bytes": sum(it.nbytes for it in tensor_items),
        "tensors": len(tensor_items),
        "objects": len(written) - len(tensor_items),
        "files": sorted({w.relative_path for w in written}),
    }
    write_file_atomic(os.path.join(partial, MANIFEST), json.dumps(manifest, indent=1).encode())
    tmp = os.path.join(partial, ".metadata.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(metadata, f)
        f.flush()
        os.fsync(f.fileno())
    ctx.fault("metadata")
    os.rename(tmp, os.path.join(partial, ".metadata"))
    fsync_dir(partial)
    ctx.fault("publish")
    if job.get("into"):
        publish_into(partial, path, markers=(".metadata", MANIFEST))
    else:
        publish_dir(partial, path, overwrite=job["overwrite"])
    remove_stale_partials(path)
    ctx.events.emit(
        "job.checkpoint",
        {
            "job": job.get("job_name"),
            "path": path,
            "step": job.get("step"),
            "save_id": job["save_id"],
            "world_size": job["world"],
            "bytes": manifest["tensor_bytes"],
            "stall_s": ctx.staged_s,
            "duration_s": time.monotonic() - started,
        },
    )
