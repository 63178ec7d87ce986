"""Staging by a helper process that reads the training process's memory, and the guard that makes it safe.

The capture engine's worker (overlapped captures) and the weight publisher's leader (overlapped
pushes) both copy tensors out of the training process while it runs on. Three parts, used by both:

- :func:`pull_from` (in the helper): ``process_vm_readv`` of ``(remote address, arena offset,
  nbytes)`` segments straight into a shared arena; no thread of the training process involved.
- :class:`MemoryProbe` (in the training process) and :func:`can_read` (in the helper): whether
  ptrace rules (Yama, seccomp) let the helper read this process at all. The helper reads back a
  buffer of known bytes once, at start; where it cannot, the caller copies for itself.
- :func:`guard_optimizer_steps`: one global ``optimizer.step()`` pre-hook, installed once per
  process. Every step first asks each guarded handle ``hold_optimizer_step()`` (it waits, or
  orders the GPU's work, until the tensors may change) and drops the handle once it answers
  True; the time a step spent in it is added to the handle's ``blocked_s``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from typing import Protocol

from lockstep.capture.arena import Arena


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_IOV_MAX = 1024
_libc = ctypes.CDLL(None, use_errno=True)


def pull_from(pid: int, arena: Arena, segments: list[tuple[int, int, int]], expect: bytes | None = None) -> bool:
    """Copy ``(remote address, arena offset, nbytes)`` segments of process ``pid`` into ``arena``.

    One ``process_vm_readv`` per 1,024 segments: the kernel copies straight from the training
    process's tensors into the shared pages. ``expect``: compare the arena's first bytes with it.
    """
    base = arena.address
    todo = [(remote, base + offset, n) for remote, offset, n in segments if n]
    while todo:
        batch, todo = todo[:_IOV_MAX], todo[_IOV_MAX:]
        local = (_Iovec * len(batch))(*[(dst, n) for _, dst, n in batch])
        remote = (_Iovec * len(batch))(*[(src, n) for src, _, n in batch])
        want = sum(n for _, _, n in batch)
        got = _libc.process_vm_readv(pid, local, len(batch), remote, len(batch), 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)}")
        if got < want:  # stopped at a segment boundary or inside one: go on from there
            rest, done = [], got
            for src, dst, n in batch:
                if done >= n:
                    done -= n
                    continue
                rest.append((src + done, dst + done, n - done))
                done = 0
            todo = rest + todo
    if expect is not None:
        return bytes(arena.memoryview(0, len(expect))) == expect
    return True


class MemoryProbe:
    """Known bytes in this process for a helper to read back; keep the probe until it answered."""

    PATTERN = b"lockstep probe: can a helper process read this process's memory?"

    def __init__(self):
        self._buffer = ctypes.create_string_buffer(self.PATTERN)

    def request(self) -> list:
        """``[pid, address, length, expected hex]``: what :func:`can_read` takes (picklable, JSON-safe)."""
        return [os.getpid(), ctypes.addressof(self._buffer), len(self.PATTERN), self.PATTERN.hex()]


def can_read(request: list) -> bool:
    """In the helper: can it read the process that made ``request`` (a :meth:`MemoryProbe.request`)?"""
    pid, address, length, expected_hex = request
    probe = Arena(length, name="lockstep-probe")
    try:
        return pull_from(pid, probe, [(address, 0, length)], expect=bytes.fromhex(expected_hex))
    except OSError:
        return False  # ptrace rules forbid it: the training process copies for itself
    finally:
        probe.close()


class Guarded(Protocol):
    blocked_s: float

    def hold_optimizer_step(self) -> bool:
        """Called before an optimizer step; returns True once this handle needs no more guarding."""


_GUARDED: weakref.WeakSet = weakref.WeakSet()
_hook_installed = False
_hook_lock = threading.Lock()


def _before_optimizer_step(optimizer, args, kwargs) -> None:
    for handle in list(_GUARDED):
        started = time.perf_counter()
        released = handle.hold_optimizer_step()
        handle.blocked_s += time.perf_counter() - started
        if released:
            _GUARDED.discard(handle)


def guard_optimizer_steps(handle: Guarded) -> None:
    """Every ``optimizer.step()`` of this process waits for ``handle`` until it releases the tensors."""
    global _hook_installed
    with _hook_lock:
        if not _hook_installed:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            register_optimizer_step_pre_hook(_before_optimizer_step)
            _hook_installed = True
    _GUARDED.add(handle)
