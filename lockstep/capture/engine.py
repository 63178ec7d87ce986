"""The capture engine: stage tensors into a reusable shared arena, drain them in a background process.

One :class:`Engine` per training process. :meth:`Engine.capture` copies every tensor once into
the arena (CPU: one ``copy_`` per tensor; CUDA: ``non_blocking`` device-to-host copies on a side
stream into the registered arena, then one synchronize) and returns as soon as the copies are
done; the engine's worker process then runs the capture's *sink* over the same pages.

Invariants:

- **One capture in flight.** The arena is reused, so the next capture may only stage once the
  worker has finished reading the previous one. ``block=True`` (the default) waits for it: a
  checkpoint that was asked for is one the caller expects to exist. ``block=False`` raises
  :class:`CaptureInFlight` at once, for periodic captures that would rather skip a tick than
  stall training.
- **Bounded memory.** The engine holds one arena, sized to the largest capture seen (the sum of
  its tensors' bytes, each rounded up to 256 bytes); a capture that does not fit replaces it.
  The worker maps the same pages and makes no copy of its own.
- **Nothing half-staged is ever sent.** The job goes to the worker only after every copy is
  complete; a process killed while staging leaves nothing for the worker to publish.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import torch

from lockstep.capture.arena import Arena, Layout
from lockstep.capture.channel import Channel, ChannelClosed

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class CaptureFailed(RuntimeError):
    """The background part of a capture failed: nothing was published for it."""


class CaptureInFlight(RuntimeError):
    """A capture was asked for with ``block=False`` while the previous one is still draining."""


class CaptureHandle:
    """A staged capture. ``staged_s`` is how long the caller was blocked; :meth:`wait` for the rest."""

    def __init__(self, engine: Engine, capture_id: int, nbytes: int, staged_s: float, waited_s: float):
        self.id = capture_id
        self.nbytes = nbytes
        self.staged_s = staged_s
        self.waited_s = waited_s  # of staged_s, time spent waiting for the previous capture
        self._engine = engine
        self._result: dict | None = None
        self._error: str | None = None
        self._finished = threading.Event()

    def done(self) -> bool:
        if not self._finished.is_set():
            self._engine._collect(timeout=0.0)
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> dict:
        """The sink's result; :class:`CaptureFailed` if it failed, ``TimeoutError`` if not done in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._finished.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"capture {self.id} still draining after {timeout} s")
            self._engine._collect(timeout=left)
        if self._error is not None:
            raise CaptureFailed(self._error)
        return self._result

    @property
    def failed(self) -> bool:
        return self._finished.is_set() and self._error is not None

    def _finish(self, result: dict | None, error: str | None) -> None:
        self._result, self._error = result, error
        self._finished.set()


class BackgroundProcess:
    """A helper process of this one, started from ``module``'s ``main(fd)``, and the channel to it.

    ``python -I``: it ignores PYTHON* variables (a job's PYTHONPATH, an injected sitecustomize)
    and the user's site directory, and imports only the lockstep package it was started from.
    """

    def __init__(self, module: str = "lockstep.capture.worker"):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        boot = f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from {module} import main; main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, str(child.fileno())],
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.channel = Channel(parent)
        self.arenas: set[int] = set()

    def exit_status(self, timeout: float = 5.0) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self, timeout: float = 30.0) -> None:
        self.channel.close()
        if self.exit_status(timeout) is None:
            self.proc.kill()
            self.proc.wait()


class Engine:
    """Stages captures into one shared arena and drains them through one background worker."""

    def __init__(self, *, name: str = "lockstep-capture"):
        self.name = name
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._arena: Arena | None = None
        self._arena_id = 0
        self._worker: BackgroundProcess | None = None
        self._in_flight: CaptureHandle | None = None
        self._streams: dict[torch.device, Any] = {}
        self._closed = False

    # -- public ---------------------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        """Host memory the engine holds: the arena (the worker shares its pages)."""
        return self._arena.capacity if self._arena is not None else 0

    @property
    def in_flight(self) -> CaptureHandle | None:
        with self._lock:
            if self._in_flight is not None and self._in_flight.done():
                self._in_flight = None
            return self._in_flight

    @property
    def worker_pid(self) -> int | None:
        return self._worker.proc.pid if self._worker is not None else None

    def start(self) -> None:
        """Start the worker now (it imports torch, which takes a while) instead of at the first capture."""
        with self._lock:
            self._ensure_worker()

    def capture(self, tensors: Mapping[str, torch.Tensor], sink: str, job: dict, *, block: bool = True) -> CaptureHandle:
        """Stage ``tensors`` and hand them with ``job`` to ``sink`` in the worker.

        Returns once every tensor is copied into the arena; the tensors may change afterwards.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("engine is closed")
            started = time.perf_counter()
            previous = self._in_flight
            if previous is not None and not previous.done():
                if not block:
                    raise CaptureInFlight(f"capture {previous.id} is still draining; not staging another")
                with contextlib.suppress(CaptureFailed):  # reported on its own handle
                    previous.wait()
            self._in_flight = None
            waited = time.perf_counter() - started
            sources = _check_sources(tensors)
            layout = Layout.of(sources)
            worker = self._ensure_worker()
            self._ensure_arena(layout, worker)
            self._stage(self._arena.views(layout), list(sources.values()))
            capture_id = next(self._ids)
            handle = CaptureHandle(self, capture_id, layout.nbytes, time.perf_counter() - started, waited)
            self._in_flight = handle
            try:
                worker.channel.send(("job", capture_id, self._arena_id, layout, sink, job, handle.staged_s))
            except ChannelClosed:
                self._worker_lost(worker)
            return handle

    def abort(self, handle: CaptureHandle) -> None:
        """Ask the worker to abandon ``handle`` (a sink that waits on other ranks stops waiting)."""
        with self._lock:
            if self._worker is not None and not handle._finished.is_set():
                try:
                    self._worker.channel.send(("abort", handle.id))
                except ChannelClosed:
                    self._worker_lost(self._worker)

    def close(self, *, wait: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            if wait and self._in_flight is not None:
                with contextlib.suppress(CaptureFailed):
                    self._in_flight.wait()
            self._closed = True
            if self._worker is not None:
                self._worker.close()
                self._worker = None
            if self._arena is not None:
                self._arena.close()
                self._arena = None

    # -- internals -------------------------------------------------------------------------------

    def _ensure_worker(self) -> BackgroundProcess:
        if self._worker is None or self._worker.proc.poll() is not None:
            if self._worker is not None:
                self._worker_lost(self._worker)
            self._worker = BackgroundProcess()
        return self._worker

    def _ensure_arena(self, layout: Layout, worker: BackgroundProcess) -> None:
        if self._arena is None or not self._arena.fits(layout):
            if self._arena is not None:
                if self._arena_id in worker.arenas:
                    worker.channel.send(("drop", self._arena_id))
                    worker.arenas.discard(self._arena_id)
                self._arena.close()
            self._arena = None  # release before allocating: at most one arena resident
            self._arena = Arena(layout.nbytes, name=self.name)
            self._arena_id += 1
        if self._arena_id not in worker.arenas:
            worker.channel.send(("arena", self._arena_id, self._arena.capacity), fds=[self._arena.fd])
            worker.arenas.add(self._arena_id)

    def _stage(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        host: list[tuple[torch.Tensor, torch.Tensor]] = []
        for dst, src in zip(dsts, srcs, strict=True):
            (by_device.setdefault(src.device, []) if src.is_cuda else host).append((dst, src))
        with torch.no_grad():
            # Device copies first: they run on the copy engines while the host copies below run.
            for device, pairs in by_device.items():
                if not self._arena.pin():
                    raise CaptureFailed("CUDA tensors to stage but the arena could not be registered with CUDA")
                stream = self._streams.get(device)
                if stream is None:
                    stream = self._streams[device] = torch.cuda.Stream(device)
                # The copies must see every kernel already queued on the training stream.
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    for dst, src in pairs:
                        dst.copy_(src, non_blocking=True)
            for dst, src in host:
                dst.copy_(src)
            for device in by_device:
                self._streams[device].synchronize()

    def _collect(self, timeout: float | None) -> None:
        """Read one reply from the worker (or notice that it died) and finish the handle it names."""
        with self._lock:
            handle = self._in_flight
            worker = self._worker
            if handle is None or handle._finished.is_set() or worker is None:
                return
            try:
                msg, _ = worker.channel.recv(timeout=timeout)
            except TimeoutError:
                return
            except ChannelClosed:
                self._worker_lost(worker)
                return
            kind, capture_id, payload = msg
            if capture_id != handle.id:
                return  # a reply to a capture already given up on
            if kind == "done":
                handle._finish(payload, None)
            else:
                handle._finish(None, payload)

    def _worker_lost(self, worker: BackgroundProcess) -> None:
        status = worker.exit_status()
        if self._in_flight is not None and not self._in_flight._finished.is_set():
            how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited with status {status}"
            self._in_flight._finish(None, f"the background worker (pid {worker.proc.pid}) {how} before capture {self._in_flight.id} finished; nothing was published for it")
        worker.channel.close()
        if self._worker is worker:
            self._worker = None


def check_tensor(key: str, t: object) -> torch.Tensor:
    """``t`` detached if the engine can stage it; a TypeError/ValueError naming ``key`` if not."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{key!r}: expected a tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{key!r}: {t.layout} tensors cannot be staged; only dense (strided) tensors")
    if t.is_meta:
        raise ValueError(f"{key!r}: a meta tensor has no data to capture")
    if t.is_quantized:
        raise TypeError(f"{key!r}: quantized tensors cannot be staged")
    return t.detach()


def _check_sources(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: check_tensor(key, t) for key, t in tensors.items()}
