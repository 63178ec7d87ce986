"""The rollout side of a weight push: receive the next version beside the running one, then swap.

Every tensor has two buffers, in memory shared with this replica's receiver, a process of its
own (``lockstep.weights.receiver``) that holds the connections to the publisher and writes an
incoming version only into the buffers that the running version does not use. When every stream
of a version is in, the receiver offers it and it becomes *pending*. The generation loop takes
the weights through :meth:`WeightReplica.hold`: on entry, and only when no other generation holds
them, a pending version is swapped in (one pointer per changed tensor, and ``param.data`` for a
bound module); inside, the weights never change. So a generation runs on exactly one version.

A rollout step waits at most one swap, by construction: receiving runs in another process, so no
receiving thread shares this process's GIL; ``hold()`` reads the receiver's offers itself (a
non-blocking poll of its channel), and the only other thread here wakes only when a newer version
starts arriving before the pending one was taken (it is then dropped: its buffers are about to
be overwritten) and holds the lock for a few assignments.

If the publisher goes away, the replica keeps its version and the receiver reconnects; the
leader then sends it everything again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from lockstep.capture.arena import Arena
from lockstep.capture.channel import Channel, ChannelClosed
from lockstep.capture.engine import BackgroundProcess
from lockstep.weights.receiver import buffer_layout


@dataclass(frozen=True)
class Weights:
    """One version's tensors, stable for as long as it is held."""

    version: int
    tensors: Mapping[str, torch.Tensor]
    lock_wait_s: float = 0.0  # how long this hold() waited for the replica's lock
    swap_s: float = 0.0  # the swap this hold() did on entry (0: none)


class WeightReplica:
    def __init__(
        self,
        address: tuple[str, int],
        *,
        name: str | None = None,
        token: str | None = None,
        reconnect: bool = True,
        connect_timeout_s: float = 60.0,
    ):
        self.address = (address[0], int(address[1]))
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._cond = threading.Condition()  # hold() and swaps; the retract thread keeps it for a few assignments
        self._keys: list[str] = []
        self._layout: list | None = None
        self._arena: Arena | None = None
        self._buffers: list[list[torch.Tensor]] = []
        self._active: list[int] | None = None
        self._version: int | None = None
        self._tensors: Mapping[str, torch.Tensor] = MappingProxyType({})
        self._pending: tuple[int, list[int]] | None = None
        self._holders = 0
        self._bound: list[tuple[int, torch.Tensor]] = []
        self._closed = False
        self.swaps = 0
        self.last_swap_s = 0.0
        self.max_swap_s = 0.0
        self.max_lock_wait_s = 0.0  # longest a hold() waited for the lock
        self._errors: list[str] = []
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._proc = BackgroundProcess("lockstep.weights.receiver")
        self._channel = self._proc.channel
        init = {"address": list(self.address), "name": self.name, "token": token, "reconnect": reconnect, "connect_timeout_s": connect_timeout_s}
        self._channel.send(("init", init), fds=[theirs.fileno()])
        theirs.close()
        self._retract = Channel(mine)
        self._thread = threading.Thread(target=self._answer_retracts, name=f"replica-{self.name}-retract", daemon=True)
        self._thread.start()

    # -- what a rollout loop uses ----------------------------------------------------------------

    @property
    def errors(self) -> list[str]:
        """What went wrong so far (the receiver's reports, oldest first)."""
        with self._cond:
            self._drain()
            return list(self._errors)

    @property
    def version(self) -> int | None:
        """The version generations run on (None before the first)."""
        return self._version

    def wait_for_version(self, at_least: int = 1, timeout: float | None = None) -> int:
        """Block until a version ``>= at_least`` is running or pending; returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                self._drain()
                newest = max(v for v in (self._version, self._pending[0] if self._pending else None, -1) if v is not None)
            if newest >= at_least:
                return newest
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"replica {self.name}: no version >= {at_least} after {timeout} s ({self._errors[-1:]})")
            if self._closed:
                raise ConnectionError(f"replica {self.name}: the receiver exited ({self._errors[-1:]})")
            self._channel.poll(left)  # outside the lock: the retract thread may need it

    @contextlib.contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[Weights]:
        """The weights of one version, unchanged until the block ends (swap to a newer one on entry)."""
        while True:
            if self._version is None:
                self.wait_for_version(1, timeout)  # only before the first version
            asked = time.perf_counter()
            with self._cond:
                lock_wait = time.perf_counter() - asked
                self.max_lock_wait_s = max(self.max_lock_wait_s, lock_wait)
                swap_s = 0.0
                if self._holders == 0:
                    self._drain()
                    if self._pending is not None:
                        swap_s = self._swap()
                if self._version is None:
                    continue  # the first version was superseded before it was taken: wait for the next
                self._holders += 1
                weights = Weights(self._version, self._tensors, lock_wait, swap_s)
                break
        try:
            yield weights
        finally:
            with self._cond:
                self._holders -= 1

    def bind(self, module: nn.Module) -> None:
        """Make ``module``'s parameters and buffers follow the running version (same names)."""
        with self._cond:
            self._drain()
            if self._layout is None:
                raise RuntimeError("no layout yet: call wait_for_version() first")
            index = {k: i for i, k in enumerate(self._keys)}
            own = dict(module.named_parameters())
            own.update(dict(module.named_buffers()))
            missing = sorted(set(own) - set(index))
            if missing:
                raise KeyError(f"the publisher has no tensors named {missing[:5]}")
            self._bound = [(index[name], t) for name, t in own.items()]
            if self._active is not None:
                self._rebind(range(len(self._keys)))

    def close(self) -> None:
        self._closed = True
        self._proc.close(timeout=10)  # the receiver exits when its channel closes
        self._retract.close()
        self._thread.join(timeout=10)

    # -- under self._cond ------------------------------------------------------------------------

    def _drain(self) -> None:
        """Take what the receiver has sent (never waits: a poll, then whole frames)."""
        while not self._closed and self._channel.poll(0):
            try:
                msg, fds = self._channel.recv()
            except (ChannelClosed, OSError) as exc:
                self._closed = True
                self._errors.append(f"the receiver exited: {exc!r} ({self._proc.exit_status(0)})")
                return
            if msg[0] == "offer":
                self._pending = (msg[1], msg[2])
            elif msg[0] == "layout":
                self._allocate(msg[1], msg[2], fds[0])
            elif msg[0] == "error":
                self._errors.append(msg[1])

    def _allocate(self, layout: list, capacity: int, fd: int) -> None:
        # Mapped with every page in this process's page table now: a step that touches a version
        # just swapped in takes no page faults on it.
        self._arena = Arena(capacity, fd=fd, populate=True)
        views = self._arena.own_storage_views(buffer_layout(layout))  # a saved tensor saves its own bytes only
        self._layout = layout
        self._keys = [k for k, _, _, _ in layout]
        self._buffers = [views[2 * i : 2 * i + 2] for i in range(len(layout))]

    def _swap(self) -> float:
        started = time.perf_counter()
        version, mapping = self._pending
        self._pending = None
        old = self._active
        self._active = mapping
        self._version = version
        self._tensors = MappingProxyType({k: self._buffers[i][mapping[i]] for i, k in enumerate(self._keys)})
        self._rebind([i for i in range(len(mapping)) if old is None or old[i] != mapping[i]])
        with contextlib.suppress(ChannelClosed, OSError):
            self._channel.send(("applied", version, mapping))  # a few bytes on a local socket
        self.swaps += 1
        self.last_swap_s = time.perf_counter() - started
        self.max_swap_s = max(self.max_swap_s, self.last_swap_s)
        return self.last_swap_s

    def _rebind(self, changed) -> None:
        wanted = set(changed)
        with torch.no_grad():
            for i, t in self._bound:
                if i in wanted:
                    t.data = self._buffers[i][self._active[i]]

    # -- the one thread -------------------------------------------------------------------------

    def _answer_retracts(self) -> None:
        """A newer version arrives before the pending one was swapped in: drop it, say so."""
        while True:
            try:
                msg, _ = self._retract.recv()
            except (ChannelClosed, OSError):
                return
            with self._cond:
                self._drain()  # its offer may still be in the channel
                if self._pending is not None and self._pending[0] == msg[1]:
                    self._pending = None
                    with contextlib.suppress(ChannelClosed, OSError):
                        self._channel.send(("declined", msg[1]))
                # otherwise it was applied, and the receiver has (or will read) the "applied"
