"""Cluster time: what the local socket's ``time`` op answers.

Clock sync plugs in a *provider* — any object with a ``cluster_time() -> ClusterTime`` method
that is fast (no I/O, no locks held for long: it answers on the local socket's thread),
thread-safe, and raises nothing in normal operation::

    clock = ctx.services["cluster_clock"]      # in an activity
    clock.provide(my_estimator)                # from now on `time` answers from it
    ...
    clock.provide(None)                        # e.g. when the clock-sync activity stops

Until a provider is plugged in (or when it raises, or returns something else than a
:class:`ClusterTime`), the answer is the local clock: ``synced: false``, offset 0, drift 0,
``sigma_ns: null``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from agent import log as agentlog


@dataclass(frozen=True)
class ClusterTime:
    cluster_time_ns: int  # the cluster's time now, in ns since the Unix epoch
    offset_ns: int  # cluster time minus this node's CLOCK_REALTIME
    drift_ppm: float  # rate of this node's clock relative to the cluster's
    sigma_ns: int | None  # one standard deviation of cluster_time_ns; None when not synced
    synced: bool

    def answer(self) -> dict:
        return {"cluster_time_ns": self.cluster_time_ns, "offset_ns": self.offset_ns,
                "drift_ppm": self.drift_ppm, "sigma_ns": self.sigma_ns, "synced": self.synced}


class ClusterTimeProvider(Protocol):
    def cluster_time(self) -> ClusterTime: ...


def local_time() -> ClusterTime:
    return ClusterTime(time.time_ns(), 0, 0.0, None, False)


class ClusterClock:
    """The agent's one source of cluster time: the plugged-in provider, else the local clock."""

    def __init__(self) -> None:
        self._provider: ClusterTimeProvider | None = None
        self._lock = threading.Lock()
        self._failures = 0

    def provide(self, provider: ClusterTimeProvider | None) -> None:
        with self._lock:
            self._provider = provider
            self._failures = 0

    @property
    def provider(self) -> ClusterTimeProvider | None:
        return self._provider

    def now(self) -> ClusterTime:
        provider = self._provider
        if provider is None:
            return local_time()
        try:
            answer = provider.cluster_time()
            if not isinstance(answer, ClusterTime):
                raise TypeError(f"cluster_time() returned {type(answer).__name__}, not ClusterTime")
            return answer
        except Exception as exc:  # a broken provider must not break `time`: fall back, say so sometimes
            self._failures += 1
            if self._failures == 1 or self._failures % 1000 == 0:
                agentlog.error("clusterclock.provider_failed", failures=self._failures,
                               error=f"{type(exc).__name__}: {exc}", msg="answering from the local clock")
            return local_time()
