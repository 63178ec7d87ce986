"""The ``clock.estimate`` telemetry kind: one record per node and window, the pairs it estimated.

Its handler keeps the newest estimate of every pair (``services.store_estimates``) and lets the
network solve run (at most every ``CLOCK_SOLVE_MIN_INTERVAL_S`` per cluster).
"""

from __future__ import annotations

from console.telemetry import kinds
from console.telemetry.kinds import StoredRecords, TelemetryKind

MAX_PAIRS = 64
_NAME = kinds.text(200)

_pair = kinds.shape({"peer": _NAME, "offset_ns": kinds.number(-3600e9, 3600e9),
                     "drift_ppm": kinds.number(-2000, 2000), "sigma_ns": kinds.number(0, 3600e9),
                     "min_owd_ns": kinds.number(-3600e9, 3600e9), "probes_used": kinds.integer(0)},
                    required=("peer", "offset_ns", "drift_ppm", "sigma_ns"), limits=kinds.bounded(max_bytes=2048))
_failed = kinds.shape({"peer": _NAME, "error": kinds.text(300)}, required=("peer",),
                      limits=kinds.bounded(max_bytes=1024))



CLOCK_ESTIMATE = kinds.shape(
    {"format": kinds.text(64), "node": _NAME, "t_ref_ns": kinds.integer(1), "window_s": kinds.number(0, 3600),
     "timestamping": kinds.text(16), "pairs": kinds.list_of(kinds.nested(_pair), MAX_PAIRS),
     "failed": kinds.list_of(kinds.nested(_failed), MAX_PAIRS), "synced": kinds.boolean(),
     "applied_offset_ns": kinds.number(-3600e9, 3600e9), "applied_sigma_ns": kinds.number(0)},
    required=("node", "t_ref_ns", "pairs"),
    limits=kinds.bounded(max_bytes=64 * 1024, max_items=MAX_PAIRS),
)


def _store_and_solve(stored: StoredRecords) -> None:
    from console.clocks import services

    services.store_estimates(stored)


kinds.register(TelemetryKind(
    name="clock.estimate",
    description="One clock-sync window of a node: the offset, drift and uncertainty of each pair it estimated "
                "(peer's clock − its own), and the correction it applied.",
    validate=CLOCK_ESTIMATE,
    handlers=[_store_and_solve],
))
