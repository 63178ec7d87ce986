"""The bound on how far a rank may run ahead of the off-node copy of its small state.

In a multi-node job each node's supervisor sends its ranks' small state (``smallstate``) to the
supervisor of the next node of a ring, which acknowledges what it holds (``orchestrator.node``).
If a node is lost, its ranks are replaced from those copies, and the recovery redoes at most the
step that was in flight (``orchestrator.core.plan_recovery``): a lost rank's copy must hold the
boundary before the survivors' slowest step, ``post(S - 1)``. The survivors can finish step
``k + 1`` only once the rank has handed them its gradients of that step, so the rank holds its
first gradient collective of step ``k + 1`` until the copy of ``post(k)`` -- written a whole
forward pass earlier -- is acknowledged (``must_wait``). When the forward pass changed the rank's
buffers (batch-norm statistics), the copy of ``mid(k)`` must be held too: the replacement redoing
that step pins the buffers from it (``replacement.Plan.pin``). The records (data-loader
iterators) written before ``post(k)`` travel in the same batch as it or an earlier one.

Two shared-memory words per node directory make the waits event-driven (a Linux futex on a
file-backed shared mapping, so two processes can wait on and wake the same word):

* ``rank<R>.copy`` (the supervisor writes, the rank reads): a wake counter, the gate (1 while
  the node has a holder to copy to), the acknowledged ``post`` and ``mid`` steps;
* ``written`` (every rank writes, the supervisor's forwarder waits on it): changed after each
  ``post`` write (and ``mid``, when the gate needs it) so the forwarder sends at once instead of
  polling; the other slots go with the next batch.

In the normal case the rank reads two integers and goes on; it waits only when its supervisor,
the network or the holder is more than a forward pass behind.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import struct
import time

_COPY = struct.Struct("<IIqq")  # wake counter, gate, acknowledged post step, acknowledged mid step
COPY_SIZE = 64
NONE = -1  # no acknowledged copy (yet, or since the holder changed)

_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_wait(word: ctypes.c_uint32, expected: int, timeout_s: float):
    if _SYS_FUTEX is None:  # no futex number known for this machine: a short nap instead
        time.sleep(min(timeout_s, 0.001))
        return
    ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    # Returns at once if the word is no longer ``expected`` (nothing is missed), on a wake, or at
    # the timeout. Every argument a full register: syscall(2) is variadic.
    _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.byref(word), ctypes.c_long(_FUTEX_WAIT),
                  ctypes.c_long(expected), ctypes.byref(ts), ctypes.c_void_p(None), ctypes.c_long(0))


def _waker(word: ctypes.c_uint32):
    """A call that wakes every waiter on ``word`` (its arguments built once: it runs per step)."""
    if _SYS_FUTEX is None:
        return lambda: None
    args = (ctypes.c_long(_SYS_FUTEX), ctypes.byref(word), ctypes.c_long(_FUTEX_WAKE), ctypes.c_long(0x7FFFFFFF),
            ctypes.c_void_p(None), ctypes.c_void_p(None), ctypes.c_long(0))
    syscall = _libc.syscall
    return lambda: syscall(*args)


def must_wait(step_no: int, acked_post: int, acked_mid: int, needs_mid: bool) -> bool:
    """Whether a rank at its first gradient collective of step ``step_no + 1`` (boundary
    ``step_no`` done, ``mid(step_no)`` written) has to wait for its off-node copy."""
    return acked_post < step_no or (needs_mid and acked_mid < step_no)


def copy_path(node_dir: str, rank: int) -> str:
    return os.path.join(node_dir, f"rank{rank}.copy")


def written_path(node_dir: str) -> str:
    return os.path.join(node_dir, "written")


def _map(path: str, size: int, create: bool) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    try:
        if create and os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


class CopyState:
    """The supervisor's side of ``rank<R>.copy``."""

    def __init__(self, node_dir: str, rank: int):
        self._map = _map(copy_path(node_dir, rank), COPY_SIZE, create=True)
        self._word = ctypes.c_uint32.from_buffer(self._map, 0)
        self._wake = _waker(self._word)
        self.gate, self.post, self.mid = 0, NONE, NONE
        self._store()

    def set(self, *, gate: bool | None = None, post: int | None = None, mid: int | None = None):
        if gate is not None:
            self.gate = int(gate)
        if post is not None:
            self.post = post
        if mid is not None:
            self.mid = mid
        self._store()

    def _store(self):
        wake = (self._word.value + 1) & 0xFFFFFFFF
        _COPY.pack_into(self._map, 0, wake, self.gate, self.post, self.mid)
        self._wake()


class CopyGate:
    """The rank's side: ``wait`` returns at once while the copy is current enough, else sleeps
    on the futex until the supervisor acknowledges more (or opens the gate: no holder)."""

    NOTE_AFTER_S = 10.0

    def __init__(self, node_dir: str, rank: int, say):
        self._path = copy_path(node_dir, rank)
        self._map: mmap.mmap | None = None
        self._say = say
        self.checks = 0  # steps that checked their copy
        self.waits = 0  # of them, steps that had to wait
        self.waited_s = 0.0

    def _open(self) -> bool:
        if self._map is None:
            try:
                self._map = _map(self._path, COPY_SIZE, create=False)
            except (FileNotFoundError, ValueError):
                return False  # a single-node job: no copy off the node
            self._word = ctypes.c_uint32.from_buffer(self._map, 0)
        return True

    def wait(self, step_no: int, needs_mid: bool):
        if not self._open():
            return
        self.checks += 1
        wake, gate, post, mid = _COPY.unpack_from(self._map, 0)
        if not gate or not must_wait(step_no, post, mid, needs_mid):
            return
        self.waits += 1
        started = time.monotonic()
        noted = started
        while gate and must_wait(step_no, post, mid, needs_mid):
            _futex_wait(self._word, wake, 1.0)
            wake, gate, post, mid = _COPY.unpack_from(self._map, 0)
            if time.monotonic() - noted > self.NOTE_AFTER_S:
                noted = time.monotonic()
                self._say(f"step {step_no + 1} waits for the off-node copy of step {step_no} "
                          f"(acknowledged: {post}) for {noted - started:.0f} s")
        self.waited_s += time.monotonic() - started

    def summary(self) -> str | None:
        """A line for the rank's exit (the benchmark reads it): how often the bound held a step."""
        if not self.checks:
            return None
        return (f"off-node copy: {self.waits} of {self.checks} steps waited for it, "
                f"{self.waited_s * 1e3:.1f} ms in all")


class Written:
    """The node's ``written`` word: ranks ``touch`` it after a write, the forwarder ``wait``s."""

    def __init__(self, node_dir: str, create: bool):
        self._map = _map(written_path(node_dir), 8, create=create)
        self._word = ctypes.c_uint32.from_buffer(self._map, 0)
        self._wake = _waker(self._word)

    def value(self) -> int:
        return self._word.value

    def touch(self, rank: int, count: int):
        # A value no other rank stores and this rank did not store last: the forwarder's
        # FUTEX_WAIT on the value it read cannot miss the change.
        self._word.value = ((rank & 0xFFF) << 20) | (count & 0xFFFFF)
        self._wake()

    def wait(self, seen: int, timeout_s: float):
        _futex_wait(self._word, seen, timeout_s)
