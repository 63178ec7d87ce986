"""The trainer side of a weight push: stage each new version once, let the leader send it.

``push`` copies the weights into the shared arena (one ``copy_`` per tensor; with ``delta``, only
tensors that differ from the previous version) and returns; the leader process sends the version
to every replica, striped over ``streams`` links per replica. At most one push is in flight: the
arena holds exactly the latest version (late joiners are served from it), so the next ``push``
waits for the previous one to be delivered (``block=False`` raises ``CaptureInFlight`` instead).

Memory: one arena of the weights' size on the trainer host, shared with the leader; each replica
holds two buffers per tensor (the version it runs and the one it receives).
"""

from __future__ import annotations

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
        self._publisher = publisher
        self._result: dict | None = None

    def done(self) -> bool:
        if self._result is None:
            self._publisher._pump(timeout=0.0)
        return self._result is not None

    def wait(self, timeout: float | None = None) -> dict:
        """``{version, replicas: {name: "received" | "lost: ..."}, bytes, duration_s}``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._result is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"version {self.version} not delivered after {timeout} s")
            self._publisher._pump(timeout=left)
        return self._result


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
        start_timeout_s: float = 120.0,
    ):
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
        self._changed_at = [0] * len(self.keys)
        self._version = 0
        self._pending: PushHandle | None = None
        self._lock = threading.RLock()
        self._free = False
        self._status: dict | None = None
        self._proc = BackgroundProcess("lockstep.weights.leader")
        init = {
            "publisher": self.publisher_id,
            "job": os.environ.get("LOCKSTEP_JOB"),  # under lockstep run: the console shows it as the job's
            "layout": [[s.key, str(s.dtype), list(s.shape), s.nbytes] for s in self.layout.slots],
            "slots": list(self.layout.slots),
            "capacity": self._arena.capacity,
            "streams": streams,
            "transport": transport,
            "token": token,
            "host": host,
            "port": port,
        }
        self._proc.channel.send(("init", init), fds=[self._arena.fd])
        msg, _ = self._proc.channel.recv(timeout=start_timeout_s)
        if msg[0] != "listening":
            raise PushFailed(f"leader did not start: {msg!r}")
        self.address = tuple(msg[1]["control"])

    @property
    def version(self) -> int:
        return self._version

    def push(
        self,
        weights: nn.Module | Mapping[str, torch.Tensor],
        *,
        changed: list[str] | None = None,
        block: bool = True,
    ) -> PushHandle:
        """Stage a new version and return; the leader delivers it in the background.

        ``changed``: the names of the tensors that changed (skips comparing the others); by
        default every tensor is sent, or with ``delta=True`` those that differ from the last push.
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
                raise PushFailed(f"the weight leader process exited ({self._proc.exit_status()})") from exc
            if msg[0] == "delivered":
                result = msg[1]
                if self._pending is not None and self._pending.version == result["version"]:
                    self._pending._result = result
            elif msg[0] == "free":
                self._free = True
            elif msg[0] == "status":
                self._status = msg[1]
