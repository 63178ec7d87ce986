"""Sinks every engine has (a sink is ``"module:function"`` run by the worker on a staged capture)."""

from __future__ import annotations

import hashlib

import torch


def digest(job: dict, tensors: dict[str, torch.Tensor], ctx) -> dict:
    """A BLAKE2b digest of each staged tensor's bytes: verifies a capture without writing it."""
    out = {}
    read = 0
    for key, t in tensors.items():
        out[key] = tensor_digest(t)
        read += t.nbytes
        ctx.fault("data", read)
    return {"digests": out, "bytes": read}


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.nbytes:
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()
