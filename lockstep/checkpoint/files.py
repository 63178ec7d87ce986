"""Asynchronous ``torch.save`` files: the format frameworks with their own loaders expect.

``save_files([(path, obj), ...])`` stages every tensor inside the objects into the capture
engine's arena and returns; the worker writes each object with ``torch.save`` (tensors read
straight from the arena, each file through ``path.tmp``, fsynced, renamed, directory fsynced), so
``torch.load(path)`` reads it exactly as if ``torch.save(obj, path)`` had run. The objects'
non-tensor parts are pickled at the call and rebuilt in the worker, which therefore must be able
to import their classes (it runs the same interpreter and site-packages, not the job's
``PYTHONPATH``).

A file appears whole or not at all; files of one call are published one by one.
"""

from __future__ import annotations

import io
import os
import pickle
import time
from typing import Any

import torch

from lockstep.capture.engine import CaptureHandle, Engine, check_tensor
from lockstep.capture.fsutil import fsync_dir

_SINK = "lockstep.checkpoint.files:write"


class _TensorRef:
    """Stands for a staged tensor inside a pickled object skeleton."""

    def __init__(self, key: str):
        self.key = key


def _skeleton(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> bytes:
    """Pickle ``obj`` with each tensor replaced by a reference to its arena slot."""
    seen: dict[int, str] = {}

    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            if isinstance(o, torch.Tensor):
                key = seen.get(id(o))
                if key is None:
                    key = f"{prefix}/{len(seen)}"
                    seen[id(o)] = key
                    tensors[key] = check_tensor(key, o)
                return ("lockstep-tensor", key)
            return None

    buf = io.BytesIO()
    Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def save_files(engine: Engine, files: list[tuple[str, Any]], *, block: bool = True) -> CaptureHandle:
    """Stage the objects of ``files`` and write each to its path in the background."""
    tensors: dict[str, torch.Tensor] = {}
    job = []
    for i, (path, obj) in enumerate(files):
        job.append((os.path.abspath(os.fspath(path)), _skeleton(obj, str(i), tensors)))
    return engine.capture(tensors, _SINK, {"files": job}, block=block)


def write(job: dict, tensors: dict[str, torch.Tensor], ctx) -> dict:
    started = time.monotonic()
    written = []
    total = 0

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            if not (isinstance(pid, tuple) and pid[0] == "lockstep-tensor"):
                raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
            return tensors[pid[1]]

    for path, skeleton in job["files"]:
        obj = Unpickler(io.BytesIO(skeleton)).load()  # our own training process's skeleton
        tmp = f"{path}.lockstep-tmp"
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
            total += f.tell()
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        ctx.fault("synced")
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path))
        written.append(path)
        ctx.fault("data", total)
    return {"files": written, "bytes": total, "duration_s": time.monotonic() - started}
