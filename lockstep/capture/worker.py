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

import importlib
import os
import socket
import sys
import time
import traceback
from typing import Any

from lockstep.capture.arena import Arena
from lockstep.capture.channel import Channel, ChannelClosed
from lockstep.capture.events import EventSender
from lockstep.capture.faults import FaultPlan


class SinkContext:
    """What a sink gets besides its tensors: fault points, abort checks, agent events."""

    def __init__(self, channel: Channel, faults: FaultPlan, events: EventSender):
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

    def take_pending(self) -> list[Any]:
        out, self._pending = self._pending, []
        return out


def _resolve(sink: str):
    module, _, name = sink.partition(":")
    if not module.startswith("lockstep.") or not name:
        raise ValueError(f"sink {sink!r} must be 'lockstep.<module>:<function>'")
    return getattr(importlib.import_module(module), name)


def serve(channel: Channel) -> None:
    import torch

    torch.set_num_threads(1)
    arenas: dict[int, Arena] = {}
    ctx = SinkContext(channel, FaultPlan.from_env(), EventSender())
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
        elif kind == "job":
            _, capture_id, arena_id, layout, sink, job, staged_s = msg
            started = time.monotonic()
            tensors = None
            ctx.capture_id, ctx.staged_s = capture_id, staged_s
            try:
                tensors = dict(zip((s.key for s in layout.slots), arenas[arena_id].own_storage_views(layout), strict=True))
                result = _resolve(sink)(job, tensors, ctx) or {}
                result.setdefault("duration_s", time.monotonic() - started)
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
