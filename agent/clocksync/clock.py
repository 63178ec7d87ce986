"""Where the agent's clock-sync timestamps come from, and the cluster time built on them.

:class:`ClockSource` is the one place the agent reads time for clock sync: ``now_ns()`` for
its own readings and ``transform(kernel_ns)`` for kernel packet timestamps (SO_TIMESTAMPING,
software or hardware), so both pass through the same mapping. In production the mapping is
the identity. **Test only:** network namespaces share one kernel clock, so a testbed gives
each host a virtual clock with

- ``LOCKSTEP_TEST_CLOCK_OFFSET_NS`` — integer ns added to every timestamp;
- ``LOCKSTEP_TEST_CLOCK_DRIFT_PPM`` — rate error in ppm, applied from the epoch;
- ``LOCKSTEP_TEST_CLOCK_EPOCH_NS`` — the CLOCK_REALTIME instant at which the virtual clock
  equals real time + offset (default: when the source is made; set it to know the truth).

virtual(t) = t + offset + drift·1e-6·(t − epoch). Never set these on a real node: the agent
would then serve a wrong cluster time on purpose.

:class:`ClusterClock` maps this node's local clock to cluster time (the reference node's
clock) with the latest offset and drift the network-effect solve published for the node:
cluster(t) = t − (offset + drift·1e-6·(t − t_ref)). The probe mesh uses it to turn send and
receive stamps into one-way delays; the local socket's ``time`` op answers with
:meth:`ClusterClock.time_reply`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from agent.clusterclock import ClusterTime

ENV_OFFSET = "LOCKSTEP_TEST_CLOCK_OFFSET_NS"
ENV_DRIFT = "LOCKSTEP_TEST_CLOCK_DRIFT_PPM"
ENV_EPOCH = "LOCKSTEP_TEST_CLOCK_EPOCH_NS"
MAX_TEST_OFFSET_NS = 3600 * 10**9
MAX_TEST_DRIFT_PPM = 1000.0


class ClockConfigError(ValueError):
    """A test-clock variable is malformed (the message names it and its value)."""


@dataclass(frozen=True)
class ClockSource:
    offset_ns: int = 0
    drift_ppm: float = 0.0
    epoch_ns: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClockSource:
        env = os.environ if environ is None else environ
        raw_offset, raw_drift, raw_epoch = env.get(ENV_OFFSET, ""), env.get(ENV_DRIFT, ""), env.get(ENV_EPOCH, "")
        try:
            offset = int(raw_offset) if raw_offset.strip() else 0
        except ValueError:
            raise ClockConfigError(f"{ENV_OFFSET} must be an integer number of ns (got {raw_offset!r})") from None
        try:
            drift = float(raw_drift) if raw_drift.strip() else 0.0
        except ValueError:
            raise ClockConfigError(f"{ENV_DRIFT} must be a number of ppm (got {raw_drift!r})") from None
        try:
            epoch = int(raw_epoch) if raw_epoch.strip() else time.time_ns()
        except ValueError:
            raise ClockConfigError(f"{ENV_EPOCH} must be an integer CLOCK_REALTIME ns (got {raw_epoch!r})") from None
        if abs(offset) > MAX_TEST_OFFSET_NS:
            raise ClockConfigError(f"{ENV_OFFSET} must be within ±1 h (got {offset})")
        if not abs(drift) <= MAX_TEST_DRIFT_PPM:
            raise ClockConfigError(f"{ENV_DRIFT} must be within ±{MAX_TEST_DRIFT_PPM:g} ppm (got {raw_drift!r})")
        return cls(offset, drift, epoch)

    @property
    def virtual(self) -> bool:
        return self.offset_ns != 0 or self.drift_ppm != 0.0

    def transform(self, kernel_ns: int) -> int:
        """A kernel timestamp (CLOCK_REALTIME domain, software or hardware) on this host's clock."""
        if not self.virtual:
            return int(kernel_ns)
        return int(kernel_ns) + self.offset_ns + round(self.drift_ppm * 1e-6 * (int(kernel_ns) - self.epoch_ns))

    def now_ns(self) -> int:
        return self.transform(time.time_ns())

    def true_offset_ns(self, other: ClockSource, at_real_ns: int) -> float:
        """other − self at a real instant (what an estimator of the pair should find): tests."""
        return float(other.transform(at_real_ns) - self.transform(at_real_ns))


@dataclass(frozen=True)
class ClockState:
    """This node's clock against the reference: local − reference = offset + drift·(t − t_ref)."""

    offset_ns: float
    drift_ppm: float
    sigma_ns: float
    t_ref_ns: int  # on the local clock
    updated_ns: int  # local clock, when it was set
    reference: str | None = None


class ClusterClock:
    """Local → cluster time. Thread-safe; the state is replaced whole, never mutated."""

    def __init__(self, source: ClockSource | None = None, stale_after_s: float = 30.0, is_reference: bool = False):
        self.source = source or ClockSource.from_env()
        self.stale_after_ns = int(stale_after_s * 1e9)
        self._state: ClockState | None = None
        self._lock = threading.Lock()
        if is_reference:
            now = self.source.now_ns()
            self._state = ClockState(0.0, 0.0, 0.0, now, now, None)
        self._is_reference = is_reference

    def update(self, offset_ns: float, drift_ppm: float, sigma_ns: float, t_ref_ns: int,
               reference: str | None = None) -> None:
        """Adopt a new solution for this node (offset and drift relative to the reference at t_ref)."""
        state = ClockState(float(offset_ns), float(drift_ppm), float(sigma_ns), int(t_ref_ns),
                           self.source.now_ns(), reference)
        with self._lock:
            self._state = state

    @property
    def state(self) -> ClockState | None:
        return self._state

    def offset_at(self, local_ns: int) -> float:
        s = self._state
        if s is None:
            return 0.0
        return s.offset_ns + s.drift_ppm * 1e-6 * (int(local_ns) - s.t_ref_ns)

    def to_cluster(self, local_ns: int) -> int:
        return int(local_ns) - round(self.offset_at(local_ns))

    def to_local(self, cluster_ns: int) -> int:
        # offset varies by ≤ 1e-3 ns per ns: two fixed-point steps are exact to well under a ns.
        local = int(cluster_ns)
        for _ in range(2):
            local = int(cluster_ns) + round(self.offset_at(local))
        return local

    def synced(self, local_ns: int | None = None) -> bool:
        s = self._state
        if s is None:
            return False
        if self._is_reference:
            return True
        now = self.source.now_ns() if local_ns is None else local_ns
        return now - s.updated_ns <= self.stale_after_ns

    def now(self) -> dict:
        local = self.source.now_ns()
        s = self._state
        return {"cluster_time_ns": self.to_cluster(local), "offset_ns": self.offset_at(local),
                "drift_ppm": s.drift_ppm if s else 0.0, "sigma_ns": s.sigma_ns if s else None,
                "synced": self.synced(local)}

    def cluster_time(self):
        """The provider interface of the agent's local socket (``agent.clusterclock``): fast, never raises."""
        reading = self.now()
        # The interface's offset is cluster time − this clock: the opposite sign of the state's.
        return ClusterTime(int(reading["cluster_time_ns"]), -float(reading["offset_ns"]), float(reading["drift_ppm"]),
                            reading["sigma_ns"], bool(reading["synced"]))

    def one_way_delay_ns(self, tx_cluster_ns: int, rx_local_ns: int, tx_sigma_ns: float = 0.0) -> tuple[int, float]:
        """(delay, its σ) of a packet the sender stamped in cluster time and this node received.

        The probe mesh's one-way delays: the sender converts its send stamp with its own
        cluster clock (and may send its σ); the receiver converts its receive stamp with this one.
        """
        s = self._state
        mine = s.sigma_ns if s else float("inf")
        return self.to_cluster(rx_local_ns) - int(tx_cluster_ns), (mine**2 + tx_sigma_ns**2) ** 0.5

    def time_reply(self, request_id: int) -> dict:
        """The local socket's answer to ``{"v":1,"op":"time","id":N}`` (docs in BRIEF's contract)."""
        return {"v": 1, "id": request_id, "ok": True, **self.cluster_time().answer()}
