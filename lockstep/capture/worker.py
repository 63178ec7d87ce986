"""The persistent background process of a capture engine.

Started once per engine (``python -I``, so a training job's ``PYTHONPATH`` and any injected
``sitecustomize`` never run here), it maps the arenas the engine sends it and runs one job at a
time: a *sink* (``"module:function"``) that writes or sends the staged tensors. It never touches
a GPU and never holds the training process's GIL.

If the training process dies after a capture was staged, the job is already in this process's
socket buffer: it is finished (the data is complete in shared memory), then the worker exits.
A capture whose staging was interrupted was never sent, so it can never be published.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import socket
import sys
import threading
import time
import traceback
from typing import Any

from lockstep.capture.arena import Arena
from lockstep.capture.channel import Channel, ChannelClosed
from lockstep.capture.faults import FaultPlan
from lockstep.capture.pull import can_read, pull_from
from lockstep.events import AgentEvents


class SinkContext:
    """What a sink gets besides its tensors: fault points, abort checks, agent events."""

    def __init__(self, channel: Channel, faults: FaultPlan, events: AgentEvents):
        self._channel = channel
        self.faults = faults
        self.events = events
        self._pending: list[Any] = []
        self.capture_id = 0
        self.staged_s = 0.0  # how long the training process was blocked staging this capture

    def fault(self, point: str, written: int = 0) -> None:
        self.faults.reached(point, written)

    def aborted(self) -> bool:
        """True when the engine asked to abandon the running capture (checked by sinks that wait)."""
        while self._channel.poll(0):
            try:
                msg, fds = self._channel.recv()
            except ChannelClosed:
                return False  # the training process is gone: finish what was staged
            if msg[0] == "abort" and msg[1] == self.capture_id:
                return True
            self._pending.append((msg, fds))
        return False

    def wait_for(self, wanted: tuple) -> None:
        """Block until the engine sends ``wanted`` (other messages are kept for later)."""
        while True:
            msg, fds = self._channel.recv()
            if tuple(msg) == wanted:
                return
            if msg[0] == "abort" and msg[1] == self.capture_id:
                raise RuntimeError(f"capture {self.capture_id} abandoned while staging")
            self._pending.append((msg, fds))

    def take_pending(self) -> list[Any]:
        out, self._pending = self._pending, []
        return out


class _Drainer:
    """Runs sinks on a thread of lower priority (Linux nice values are per thread).

    Staging (pulling tensors out of the training process) stays on the main thread at normal
    priority: the next optimizer step waits for it. Draining is background work for real: when
    the host's cores are busy, training goes first (and the I/O priority of the default
    best-effort class follows the nice value).
    """

    def __init__(self, nice: int):
        self._nice = nice
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="lockstep-drain", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
        while True:
            fn, args, reply = self._jobs.get()
            try:
                reply.put((True, fn(*args)))
            except BaseException as exc:  # re-raised on the main thread
                reply.put((False, exc))

    def run(self, fn, *args):
        reply: queue.Queue = queue.Queue(maxsize=1)
        self._jobs.put((fn, args, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value


def _resolve(sink: str):
    module, _, name = sink.partition(":")
    if not module.startswith("lockstep.") or not name:
        raise ValueError(f"sink {sink!r} must be 'lockstep.<module>:<function>'")
    return getattr(importlib.import_module(module), name)


def serve(channel: Channel) -> None:
    import torch

    torch.set_num_threads(1)
    drain = _Drainer(int(os.environ.get("LOCKSTEP_CAPTURE_NICE", "10")))
    arenas: dict[int, Arena] = {}
    ctx = SinkContext(channel, FaultPlan.from_env(), AgentEvents())
    backlog: list[Any] = []
    while True:
        if backlog:
            msg, fds = backlog.pop(0)
        else:
            try:
                msg, fds = channel.recv()
            except ChannelClosed:
                return
        kind = msg[0]
        if kind == "arena":
            _, arena_id, capacity = msg
            arenas[arena_id] = Arena.attach(fds[0], capacity)
        elif kind == "drop":
            arena = arenas.pop(msg[1], None)
            if arena is not None:
                arena.close()
        elif kind == "abort":
            pass  # for a job that already finished
        elif kind == "probe":
            try:
                channel.send(("probe", can_read(msg[1])))  # if not, the engine copies in a thread
            except ChannelClosed:
                return
        elif kind == "device_staged":
            pass  # consumed by the job that waits for it; a stray one is for a failed job
        elif kind == "job":
            _, capture_id, arena_id, layout, sink, job, staged_s, staging = msg
            started = time.monotonic()
            cpu = time.process_time()
            tensors = None
            ctx.capture_id, ctx.staged_s = capture_id, staged_s
            try:
                if staging is not None:
                    # Overlapped capture: copy the host tensors out of the training process.
                    pull_from(staging["pid"], arenas[arena_id], staging["pull"])
                    if staging["device_pending"]:
                        ctx.wait_for(("device_staged", capture_id))
                    channel.send(("staged", capture_id))
                tensors = dict(zip((s.key for s in layout.slots), arenas[arena_id].own_storage_views(layout), strict=True))
                result = drain.run(_resolve(sink), job, tensors, ctx) or {}
                result.setdefault("duration_s", time.monotonic() - started)
                result["worker_cpu_s"] = time.process_time() - cpu
                reply = ("done", capture_id, result)
            except Exception as exc:  # the engine reports it on the capture's handle
                reply = ("failed", capture_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            del tensors
            try:
                channel.send(reply)
            except ChannelClosed:
                return
            backlog.extend(ctx.take_pending())
        else:
            raise ValueError(f"unknown message {kind!r}")


def main() -> None:
    fd = int(sys.argv[1])
    channel = Channel(socket.socket(fileno=fd))
    status = 0
    try:
        serve(channel)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        channel.close()
    # Skip interpreter teardown (torch's is slow); every file was closed and fsynced by its sink.
    os._exit(status)


if __name__ == "__main__":
    main()
