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
import queue
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
from lockstep.capture.pull import MemoryProbe, guard_optimizer_steps

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
        self.staged_s = staged_s  # how long capture() blocked the caller
        self.waited_s = waited_s  # of staged_s, time spent waiting for the previous capture
        self.blocked_s = 0.0  # overlapped staging: time optimizer steps waited for it
        self._engine = engine
        self._result: dict | None = None
        self._error: str | None = None
        self._finished = threading.Event()
        self._staged = threading.Event()
        self._staged.set()
        self._host_done = threading.Event()
        self._host_done.set()
        self._device_events: list = []
        self._stream_ordered = False
        self._pulled = False  # the worker copies the host tensors itself (process_vm_readv)
        self._keepalive: list | None = None  # sources the worker is still reading

    @property
    def pulled(self) -> bool:
        """True when the worker copied the host tensors itself (overlapped, process_vm_readv)."""
        return self._pulled

    @property
    def staged(self) -> bool:
        """True once every tensor is in the arena (at once unless staging overlaps training)."""
        return self._staged.is_set()

    def wait_staged(self) -> None:
        while not self._staged.is_set():
            if self._pulled:  # the worker says when it has read them: listen for it
                self._engine._collect(timeout=None)
            else:
                self._staged.wait()

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

    def hold_optimizer_step(self) -> bool:
        """The optimizer pre-step guard (``pull.guard_optimizer_steps``): True once the tensors may change."""
        if self._staged.is_set():
            return True
        if self._stream_ordered:
            return False  # the optimizer's kernels already wait for the device copies
        if self._device_events and self._host_done.wait(0):
            # Only device copies are left: order the optimizer's kernels after them, on the GPU.
            for device, event in self._device_events:
                torch.cuda.current_stream(device).wait_event(event)
            self._stream_ordered = True
            return False
        self.wait_staged()
        return True

    def _finish(self, result: dict | None, error: str | None) -> None:
        self._result, self._error = result, error
        self._set_staged()
        self._finished.set()

    def _set_staged(self) -> None:
        self._host_done.set()
        self._staged.set()
        self._keepalive = None


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

    def __init__(self, *, name: str = "lockstep-capture", pull: bool = True):
        """``pull=False``: overlapped captures always copy in a thread of this process, never
        by the worker reading this process's memory."""
        self.name = name
        self.pull = pull
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._arena: Arena | None = None
        self._arena_id = 0
        self._worker: BackgroundProcess | None = None
        self._in_flight: CaptureHandle | None = None
        self._streams: dict[torch.device, Any] = {}
        self._stager: threading.Thread | None = None  # copies of overlapped captures
        self._can_pull: bool | None = None
        self._probe = None
        self._stage_queue: queue.Queue = queue.Queue()
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
    def worker_reads_memory(self) -> bool | None:
        """Whether the worker can copy host tensors out of this process (None: not known yet)."""
        if self._worker is not None:
            self._read_ready_replies(self._worker)
        return self._can_pull

    @property
    def worker_pid(self) -> int | None:
        return self._worker.proc.pid if self._worker is not None else None

    def start(self) -> None:
        """Start the worker now (it imports torch, which takes a while) instead of at the first capture."""
        with self._lock:
            self._ensure_worker()

    def capture(
        self, tensors: Mapping[str, torch.Tensor], sink: str, job: dict, *, block: bool = True, overlap: bool = False
    ) -> CaptureHandle:
        """Stage ``tensors`` and hand them with ``job`` to ``sink`` in the worker.

        Returns once every tensor is copied into the arena; the tensors may change afterwards.

        ``overlap=True`` returns at once instead and copies while training goes on (a thread for
        host tensors, the side stream for CUDA ones); every ``optimizer.step()`` of the process
        first waits for the copies (on CUDA by making the training stream wait for them, without
        blocking the host). Only parameters and optimizer state are protected that way: tensors
        changed in place *before* the next optimizer step (BatchNorm running statistics in the
        forward pass) must not be captured with ``overlap``.
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
            self._ensure_arena(layout, worker, populate=not overlap)
            views, srcs = self._arena.views(layout), list(sources.values())
            capture_id = next(self._ids)
            message = ("job", capture_id, self._arena_id, layout, sink, job)
            if not overlap:
                self._stage(views, srcs)
                handle = CaptureHandle(self, capture_id, layout.nbytes, time.perf_counter() - started, waited)
                self._in_flight = handle
                try:
                    worker.channel.send((*message, handle.staged_s, None))
                except ChannelClosed:
                    self._worker_lost(worker)
                return handle
            handle = CaptureHandle(self, capture_id, layout.nbytes, 0.0, waited)
            handle._staged.clear()
            handle._host_done.clear()
            host = self._enqueue_device_copies(views, srcs, handle)
            guard_optimizer_steps(handle)
            self._in_flight = handle
            self._read_ready_replies(worker)
            if self.pull and self._can_pull and all(src.is_contiguous() for _, src in host):
                # The worker reads the tensors out of this process itself: no thread here, no GIL.
                offsets = {id(dst): slot.offset for slot, dst in zip(layout.slots, views, strict=True)}
                pull = [(src.data_ptr(), offsets[id(dst)], src.nbytes) for dst, src in host if src.nbytes]
                handle._pulled = True
                handle._keepalive = [src for _, src in host]
                staging = {"pid": os.getpid(), "pull": pull, "device_pending": bool(handle._device_events)}
                handle.staged_s = time.perf_counter() - started
                try:
                    worker.channel.send((*message, handle.staged_s, staging))
                except ChannelClosed:
                    self._worker_lost(worker)
                    return handle
                if handle._device_events:
                    self._start_stager()
                    self._stage_queue.put((handle, worker, ("device_staged", capture_id), []))
                return handle
            self._start_stager()
            self._stage_queue.put((handle, worker, message, host))
            handle.staged_s = time.perf_counter() - started
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
            self._stage_queue.put(None)
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
            # Can the worker read this process's memory (process_vm_readv)? It answers once it
            # runs; until then overlapped captures copy in a thread of this process.
            self._can_pull = None
            self._probe = MemoryProbe()
            self._worker.channel.send(("probe", self._probe.request()))
        return self._worker

    def _ensure_arena(self, layout: Layout, worker: BackgroundProcess, populate: bool = True) -> None:
        # populate=False for an overlapped capture: its copies (in the worker or a thread) fault
        # the pages in, off the caller's critical path.
        if self._arena is None or not self._arena.fits(layout):
            if self._arena is not None:
                if self._arena_id in worker.arenas:
                    worker.channel.send(("drop", self._arena_id))
                    worker.arenas.discard(self._arena_id)
                self._arena.close()
            self._arena = None  # release before allocating: at most one arena resident
            self._arena = Arena(layout.nbytes, name=self.name, populate=populate)
            self._arena_id += 1
        if self._arena_id not in worker.arenas:
            worker.channel.send(("arena", self._arena_id, self._arena.capacity), fds=[self._arena.fd])
            worker.arenas.add(self._arena_id)

    def _stage(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
        handle_events: list = []
        # Device copies first: they run on the copy engines while the host copies below run.
        host = self._enqueue_device_copies(dsts, srcs, None, handle_events)
        with torch.no_grad():
            for dst, src in host:
                dst.copy_(src)
        for _, event in handle_events:
            event.synchronize()

    def _enqueue_device_copies(self, dsts, srcs, handle: CaptureHandle | None, events: list | None = None):
        """Queue the CUDA tensors' copies on a side stream; return the host (CPU) pairs left to copy."""
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        host: list[tuple[torch.Tensor, torch.Tensor]] = []
        for dst, src in zip(dsts, srcs, strict=True):
            (by_device.setdefault(src.device, []) if src.is_cuda else host).append((dst, src))
        events = handle._device_events if handle is not None else events
        with torch.no_grad():
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
                        src.record_stream(stream)  # its memory is not reused before the copy ran
                    event = torch.cuda.Event()
                    event.record(stream)
                events.append((device, event))
        return host

    def _start_stager(self) -> None:
        if self._stager is None or not self._stager.is_alive():
            self._stager = threading.Thread(target=self._stager_loop, name="lockstep-stage", daemon=True)
            self._stager.start()

    def _stager_loop(self) -> None:
        while True:
            work = self._stage_queue.get()
            if work is None:
                return
            self._stage_in_background(*work)

    def _stage_in_background(self, handle: CaptureHandle, worker: BackgroundProcess, message: tuple, host) -> None:
        try:
            with torch.no_grad():
                for dst, src in host:
                    dst.copy_(src)  # releases the GIL: runs beside the training thread
            handle._host_done.set()
            for _, event in handle._device_events:
                event.synchronize()
        except Exception as exc:
            handle._finish(None, f"staging failed: {type(exc).__name__}: {exc}")
            handle._host_done.set()
            handle._staged.set()
            return
        if message[0] == "device_staged":  # the worker pulls the host part and says when done
            with contextlib.suppress(ChannelClosed):
                worker.channel.send(message)
            return
        handle._staged.set()
        with contextlib.suppress(ChannelClosed):  # the engine notices a lost worker when it reads
            worker.channel.send((*message, handle.staged_s + handle.blocked_s, None))

    def _collect(self, timeout: float | None) -> None:
        """Read one message from the worker (or notice that it died) and apply it."""
        with self._lock:
            handle = self._in_flight
            worker = self._worker
            if handle is None or handle._finished.is_set() or worker is None:
                return
            self._read_one(worker, timeout)

    def _read_ready_replies(self, worker: BackgroundProcess) -> None:
        while worker.channel.poll(0) and self._worker is worker:
            self._read_one(worker, 0)

    def _read_one(self, worker: BackgroundProcess, timeout: float | None) -> None:
        try:
            msg, _ = worker.channel.recv(timeout=timeout)
        except TimeoutError:
            return
        except ChannelClosed:
            self._worker_lost(worker)
            return
        kind = msg[0]
        if kind == "probe":
            self._can_pull = bool(msg[1])
            self._probe = None
            return
        handle = self._in_flight
        if handle is None or msg[1] != handle.id:
            return  # about a capture already given up on
        if kind == "staged":
            handle._set_staged()
        elif kind == "done":
            handle._finish(msg[2], None)
        else:
            handle._finish(None, msg[2])

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
