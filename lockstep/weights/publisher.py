"""The trainer side of a weight push: stage each new version once, let the leader send it.

``push`` copies the weights into the shared arena (one ``copy_`` per tensor; with ``delta``, only
tensors that differ from the previous version) and returns; the leader process sends the version
to every replica, striped over ``streams`` links per replica. At most one push is in flight: the
arena holds exactly the latest version (late joiners are served from it), so the next ``push``
waits for the previous one to be delivered (``block=False`` raises ``CaptureInFlight`` instead).

``push(overlap=True)`` does not copy on the trainer at all: it returns at once and the leader
reads the trainer's tensors itself (``process_vm_readv``, several threads, each chunk sent as
soon as it is in the arena), so the copy runs beside the sends instead of before them, on other
cores than the training loop's. Until the leader has read the whole version, every
``optimizer.step()`` of the process first waits for it (a global optimizer pre-step hook), and so
do ``PushHandle.wait`` and the next ``push``: only the optimizer (or the caller after ``wait``) may
change the weights. Where the leader cannot read this process (ptrace rules, CUDA or
non-contiguous tensors, a ``delta`` comparison) the push copies here as without ``overlap``.

``WeightPublisher(module, share=True)`` goes further: the module's parameters and buffers are
moved into a buffer shared with the leader (one flat memfd, each tensor its own storage in it),
so ``push(overlap=True)`` copies nothing before sending: the leader sends straight from the
trainer's weights, every optimizer step waits until every replica has them, and the leader then
copies the changed tensors into the arena (for late joiners) before it frees the weights. The
push moves each byte as a plain bulk copy does; the weights are held for the push plus that copy.

Memory: one arena of the weights' size on the trainer host, shared with the leader; each replica
holds two buffers per tensor (the version it runs and the one it receives).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Mapping

import torch
from torch import nn

from lockstep.capture.arena import Arena, Layout
from lockstep.capture.channel import ChannelClosed
from lockstep.capture.engine import BackgroundProcess, CaptureInFlight, check_tensor
from lockstep.capture.pull import MemoryProbe, guard_optimizer_steps

TRANSPORTS = ("tcp", "gloo")
PROGRESS_BYTES = 32 << 20  # while staging, tell the leader how far the copy got every 32 MiB


class PushFailed(RuntimeError):
    pass


def named_tensors(weights: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    source = weights.state_dict() if isinstance(weights, nn.Module) else weights
    if not isinstance(source, Mapping) or not source:
        raise TypeError("weights must be an nn.Module or a non-empty mapping of name -> tensor")
    return {str(k): check_tensor(str(k), v) for k, v in source.items()}


class PushHandle:
    def __init__(self, publisher: WeightPublisher, version: int, stall_s: float, changed: int, staged_bytes: int):
        self.version = version
        self.stall_s = stall_s  # how long push() blocked the trainer
        self.changed = changed  # tensors that changed since the previous version
        self.staged_bytes = staged_bytes
        self.delivered_s: float | None = None  # push() to the leader's word that every replica has it
        self.pulled = False  # overlap: the leader reads the tensors out of this process
        self.blocked_s = 0.0  # overlap: time optimizer steps waited for the leader's reads
        self._staged = True
        self._error: str | None = None
        self._keepalive: list | None = None  # sources the leader is still reading
        self._publisher = publisher
        self._result: dict | None = None
        self._started = time.perf_counter() - stall_s

    @property
    def staged(self) -> bool:
        """True once the whole version is in the arena (at once unless the leader pulls it)."""
        return self._staged

    def wait_staged(self, timeout: float | None = None) -> None:
        """Until the leader has read every tensor of this version (the weights may change then)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._staged:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"version {self.version} not staged after {timeout} s")
            self._publisher._pump(timeout=left)
        if self._error is not None:
            raise PushFailed(self._error)

    def done(self) -> bool:
        if self._result is None or not self._staged:
            self._publisher._pump(timeout=0.0)
        return self._result is not None and self._staged

    def wait(self, timeout: float | None = None) -> dict:
        """``{version, replicas: {name: "received" | "lost: ..."}, bytes, duration_s}``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._result is None or not self._staged:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"version {self.version} not delivered after {timeout} s")
            self._publisher._pump(timeout=left)
        if self._error is not None:
            raise PushFailed(self._error)
        return self._result

    def hold_optimizer_step(self) -> bool:
        """The optimizer pre-step guard (``pull.guard_optimizer_steps``): wait until the leader has read the weights."""
        with contextlib.suppress(PushFailed):  # reported by wait(); the weights are free either way
            self.wait_staged()
        return True

    def _set_staged(self, error: str | None = None) -> None:
        self._staged = True
        self._error = self._error or error
        self._keepalive = None


class WeightPublisher:
    """Publishes versions of ``weights`` (a module or a mapping of tensors with a fixed layout)."""

    def __init__(
        self,
        weights: nn.Module | Mapping[str, torch.Tensor],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        streams: int = 4,
        transport: str = "tcp",
        delta: bool = False,
        token: str | None = None,
        share: bool = False,
        start_timeout_s: float = 120.0,
    ):
        """``share=True`` (``weights`` an ``nn.Module``): move its tensors into memory shared with the leader."""
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if not 1 <= streams <= 64:
            raise ValueError(f"streams must be between 1 and 64, not {streams}")
        tensors = named_tensors(weights)
        self.keys = list(tensors)
        self.layout = Layout.of(tensors)
        self.delta = delta
        self.publisher_id = uuid.uuid4().hex
        self._arena = Arena(self.layout.nbytes, name="lockstep-weights")
        self._views = self._arena.views(self.layout)
        self._live: Arena | None = None  # share=True: the module's own tensors live here
        self._live_ptrs: list[int] = []
        if share:
            self._live, self._live_ptrs = _share(weights, self.keys, self.layout)
        self._changed_at = [0] * len(self.keys)
        self._version = 0
        self._pending: PushHandle | None = None
        self._lock = threading.RLock()
        self._free = False
        self._status: dict | None = None
        self._proc = BackgroundProcess("lockstep.weights.leader")
        # Can the leader read this process's memory (process_vm_readv)? It tries on this buffer.
        probe = MemoryProbe()
        init = {
            "probe": probe.request(),
            "publisher": self.publisher_id,
            "job": os.environ.get("LOCKSTEP_JOB"),  # under lockstep run: the console shows it as the job's
            "layout": [[s.key, str(s.dtype), list(s.shape), s.nbytes] for s in self.layout.slots],
            "slots": list(self.layout.slots),
            "capacity": self._arena.capacity,
            "live": self._live is not None,
            "streams": streams,
            "transport": transport,
            "token": token,
            "host": host,
            "port": port,
        }
        fds = [self._arena.fd] if self._live is None else [self._arena.fd, self._live.fd]
        self._proc.channel.send(("init", init), fds=fds)
        msg, _ = self._proc.channel.recv(timeout=start_timeout_s)
        if msg[0] != "listening":
            raise PushFailed(f"leader did not start: {msg!r}")
        self.address = tuple(msg[1]["control"])
        self.leader_reads_memory = bool(msg[1]["can_pull"])
        del probe

    @property
    def version(self) -> int:
        return self._version

    def push(
        self,
        weights: nn.Module | Mapping[str, torch.Tensor],
        *,
        changed: list[str] | None = None,
        block: bool = True,
        overlap: bool = False,
    ) -> PushHandle:
        """Stage a new version and return; the leader delivers it in the background.

        ``changed``: the names of the tensors that changed (skips comparing the others); by
        default every tensor is sent, or with ``delta=True`` those that differ from the last push.
        ``overlap``: return before the weights are staged; the leader reads them out of this
        process while ``optimizer.step()`` waits (see the module's text).
        """
        with self._lock:
            started = time.perf_counter()
            tensors = named_tensors(weights)
            srcs = list(tensors.values())
            if list(tensors) != self.keys:
                extra = sorted(set(tensors) ^ set(self.keys))
                raise ValueError(f"the weights' names changed since the publisher was made: {extra[:5]}")
            previous = self._pending
            if previous is not None and not previous.done():
                if not block:
                    raise CaptureInFlight(f"version {previous.version} is still being delivered")
                previous.wait()
            self._acquire()
            version = self._version + 1
            first = self._version == 0
            for slot, src in zip(self.layout.slots, tensors.values(), strict=True):
                if tuple(src.shape) != slot.shape or src.dtype != slot.dtype:
                    raise ValueError(f"{slot.key!r}: {src.dtype} {list(src.shape)} does not match {slot.dtype} {list(slot.shape)}")
            if first or changed is not None or not self.delta:
                # What changes is known before copying: the leader starts sending while we copy,
                # each segment as soon as the bytes under it are staged.
                hint = set(changed) if changed is not None and not first else None
                copy = [i for i, slot in enumerate(self.layout.slots) if hint is None or slot.key in hint]
                for i in copy:
                    self._changed_at[i] = version
                if overlap and self._live is not None and all(srcs[i].data_ptr() == self._live_ptrs[i] and srcs[i].is_contiguous() for i in copy):
                    # The module's tensors are the leader's live buffer: it sends straight from them.
                    self._proc.channel.send(("live", version, list(self._changed_at)))
                    self._version = version
                    handle = PushHandle(self, version, time.perf_counter() - started, len(copy), 0)
                    handle.pulled, handle._staged = True, False
                    guard_optimizer_steps(handle)
                    self._pending = handle
                    return handle
                if overlap and self.leader_reads_memory and all(not srcs[i].is_cuda and srcs[i].is_contiguous() for i in copy):
                    pull = [(srcs[i].data_ptr(), self.layout.slots[i].offset, self.layout.slots[i].nbytes) for i in copy]
                    self._proc.channel.send(("pull", version, list(self._changed_at), os.getpid(), pull))
                    self._version = version
                    handle = PushHandle(self, version, time.perf_counter() - started, len(copy), sum(n for _, _, n in pull))
                    handle.pulled, handle._staged, handle._keepalive = True, False, srcs
                    guard_optimizer_steps(handle)
                    self._pending = handle
                    return handle
                self._proc.channel.send(("staging", version, list(self._changed_at)))
                staged, since = 0, 0
                with torch.no_grad():
                    for i in copy:
                        self._views[i].copy_(srcs[i])
                        staged += self.layout.slots[i].nbytes
                        since += self.layout.slots[i].nbytes
                        if since >= PROGRESS_BYTES:
                            self._proc.channel.send(("progress", version, self.layout.slots[i].offset + self.layout.slots[i].nbytes))
                            since = 0
                n_changed = len(copy)
            else:
                # delta: compare each tensor with the previous version while copying
                n_changed = staged = 0
                with torch.no_grad():
                    for i, (dst, src) in enumerate(zip(self._views, srcs, strict=True)):
                        if torch.equal(dst, src):
                            continue
                        dst.copy_(src)
                        self._changed_at[i] = version
                        n_changed += 1
                        staged += self.layout.slots[i].nbytes
            self._version = version
            self._proc.channel.send(("staged", version, list(self._changed_at)))
            handle = PushHandle(self, version, time.perf_counter() - started, n_changed, staged)
            self._pending = handle
            return handle

    def status(self, timeout: float = 30.0) -> dict:
        """``{version, replicas: {name: {received, applied, sending}}}`` as the leader sees it."""
        with self._lock:
            self._status = None
            self._proc.channel.send(("status",))
            deadline = time.monotonic() + timeout
            while self._status is None:
                self._pump(timeout=max(0.0, deadline - time.monotonic()))
                if time.monotonic() > deadline:
                    raise TimeoutError("leader did not answer")
            return self._status

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.close()
                self._proc = None
            self._views = []
            self._arena.close()
            if self._live is not None:
                self._live.close()  # the module's tensors keep its pages mapped

    def _acquire(self) -> None:
        self._free = False
        self._proc.channel.send(("acquire",))
        while not self._free:
            self._pump(timeout=None)

    def _pump(self, timeout: float | None) -> None:
        """Handle one message from the leader."""
        with self._lock:
            try:
                msg, _ = self._proc.channel.recv(timeout=timeout)
            except TimeoutError:
                return
            except ChannelClosed as exc:
                why = f"the weight leader process exited ({self._proc.exit_status()})"
                if self._pending is not None and not self._pending._staged:
                    self._pending._set_staged(why)  # optimizer steps must not wait for it forever
                raise PushFailed(why) from exc
            if msg[0] == "delivered":
                result = msg[1]
                if self._pending is not None and self._pending.version == result["version"]:
                    self._pending._result = result
                    self._pending.delivered_s = time.perf_counter() - self._pending._started
            elif msg[0] == "pulled":
                if self._pending is not None and self._pending.version == msg[1]:
                    self._pending._set_staged(msg[2])
            elif msg[0] == "free":
                self._free = True
            elif msg[0] == "status":
                self._status = msg[1]


def _share(module, keys: list[str], layout: Layout) -> tuple[Arena, list[int]]:
    """Move ``module``'s parameters and buffers named ``keys`` into one new shared buffer.

    Each tensor keeps its identity (``.data`` is re-pointed, so optimizers and hooks holding it
    see the move) and gets a storage of exactly its own bytes (``torch.save`` of one saves one).
    """
    if not isinstance(module, nn.Module):
        raise TypeError("share=True takes an nn.Module: its parameters and buffers move into the shared buffer")
    own = dict(module.named_parameters(remove_duplicate=False))
    own.update(module.named_buffers(remove_duplicate=False))
    missing = [k for k in keys if k not in own]
    if missing:
        raise ValueError(f"share=True: {missing[:5]} are in the state dict but not parameters or buffers of the module")
    tensors = [own[k] for k in keys]
    if any(t.is_cuda for t in tensors):
        raise ValueError("share=True holds host tensors; CUDA weights would need a CUDA IPC buffer (not built)")
    ptrs = [t.data_ptr() for t in tensors if t.nbytes]
    if len(set(ptrs)) != len(ptrs):
        tied = sorted({k for k, t in zip(keys, tensors, strict=True) if t.nbytes and ptrs.count(t.data_ptr()) > 1})
        raise ValueError(f"share=True cannot keep tied tensors tied: {tied[:5]} share memory")
    live = Arena(layout.nbytes, name="lockstep-weights-live")
    views = live.own_storage_views(layout)
    with torch.no_grad():
        for t, view in zip(tensors, views, strict=True):
            view.copy_(t)
            t.data = view
    # The mapping stays as long as the module's tensors use it (Arena.close leaves it to them).
    return live, [v.data_ptr() for v in views]
