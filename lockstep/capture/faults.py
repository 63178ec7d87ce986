"""Named fault-injection points of the background worker, for crash tests.

``LOCKSTEP_CAPTURE_FAULT=stop:<point>[:<bytes>]`` makes the worker stop itself (``SIGSTOP``)
when it reaches ``<point>``, so a test can find it frozen mid-write and ``kill -9`` it at a known
moment instead of racing a timer. Points, in the order a write reaches them:

- ``data``: after at least ``<bytes>`` bytes of tensor data of a capture are written
- ``synced``: after the data files are fsynced, before any manifest is written
- ``metadata``: after ``.metadata`` is written under its temporary name, before it is renamed
- ``publish``: after the checkpoint directory is complete, before it is renamed into place

Unset (always, outside tests), every check is one attribute read.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "LOCKSTEP_CAPTURE_FAULT"
POINTS = ("data", "synced", "metadata", "publish")


class FaultPlan:
    def __init__(self, spec: str | None):
        self.point: str | None = None
        self.after_bytes = 0
        if not spec:
            return
        parts = spec.split(":")
        if len(parts) < 2 or parts[0] != "stop" or parts[1] not in POINTS:
            raise ValueError(f"{ENV}={spec!r}: expected stop:<{'|'.join(POINTS)}>[:<bytes>]")
        self.point = parts[1]
        self.after_bytes = int(parts[2]) if len(parts) > 2 else 0

    @classmethod
    def from_env(cls) -> FaultPlan:
        return cls(os.environ.get(ENV))

    def reached(self, point: str, written: int = 0) -> None:
        if self.point == point and written >= self.after_bytes:
            self.point = None  # once
            # To this thread, not the process: a process-directed SIGSTOP may be taken by another
            # (idle) thread, and this one would run on -- past the point, e.g. into the rename --
            # until that thread has stopped the group. Sent to itself, the stop happens before
            # this thread runs another instruction of its own (and still stops every thread).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
