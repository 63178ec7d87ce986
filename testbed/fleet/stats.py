"""Counters of a simulated agent, and a small log-bucket histogram for latencies.

Thousands of agents each keep a handful of integers; latency distributions are kept once per
fleet and operation (a fixed number of buckets, ~4.7% wide), so memory does not grow with run time.
"""

from __future__ import annotations

import math
from collections import Counter

# Buckets: 10 µs .. 1000 s, 50 per decade (each ~4.7% wide; its geometric midpoint within ~2.3%).
_PER_DECADE = 50
_LOW = 1e-5
_BUCKETS = 8 * _PER_DECADE + 1


class Histogram:
    """Latencies in seconds; percentiles within a few percent, exact count, sum and max."""

    __slots__ = ("buckets", "count", "total", "max")

    def __init__(self) -> None:
        self.buckets = [0] * _BUCKETS
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.count += 1
        self.total += seconds
        if seconds > self.max:
            self.max = seconds
        index = 0 if seconds <= _LOW else int(math.log10(seconds / _LOW) * _PER_DECADE) + 1
        self.buckets[min(index, _BUCKETS - 1)] += 1

    def merge(self, other: Histogram) -> None:
        for i, n in enumerate(other.buckets):
            self.buckets[i] += n
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0..100) in seconds; 0 when empty."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(self.count * q / 100.0))
        seen = 0
        for i, n in enumerate(self.buckets):
            seen += n
            if seen >= rank:
                if i == 0:
                    return _LOW
                low = _LOW * 10 ** ((i - 1) / _PER_DECADE)
                high = _LOW * 10 ** (i / _PER_DECADE)
                return min(math.sqrt(low * high), self.max)
        return self.max

    def summary(self) -> dict:
        """Milliseconds, rounded: count, mean, p50, p90, p99, max."""
        ms = 1000.0
        return {
            "count": self.count,
            "mean_ms": round(self.total / self.count * ms, 2) if self.count else 0.0,
            "p50_ms": round(self.percentile(50) * ms, 2),
            "p90_ms": round(self.percentile(90) * ms, 2),
            "p99_ms": round(self.percentile(99) * ms, 2),
            "max_ms": round(self.max * ms, 2),
        }


class AgentStats:
    """What one simulated agent did. `errors` counts failures as '<op>:<status>' (an HTTP status,
    or 'timeout' / 'connect' for requests that got no answer)."""

    __slots__ = (
        "enroll_attempts", "polls", "polls_empty", "polls_in_flight", "commands_received",
        "commands_redelivered", "results_posted", "results_accepted", "heartbeats", "telemetry_batches",
        "telemetry_records", "telemetry_duplicates", "inventories", "errors", "latency_sum", "latency_max",
    )

    def __init__(self) -> None:
        self.enroll_attempts = 0
        self.polls = 0
        self.polls_empty = 0
        self.polls_in_flight = 0
        self.commands_received = 0
        self.commands_redelivered = 0
        self.results_posted = 0
        self.results_accepted = 0
        self.heartbeats = 0
        self.telemetry_batches = 0
        self.telemetry_records = 0
        self.telemetry_duplicates = 0
        self.inventories = 0
        self.errors: Counter[str] = Counter()
        # Per operation: total and worst request latency (seconds) of this agent.
        self.latency_sum: Counter[str] = Counter()
        self.latency_max: dict[str, float] = {}

    def observe(self, op: str, seconds: float) -> None:
        self.latency_sum[op] += seconds
        if seconds > self.latency_max.get(op, 0.0):
            self.latency_max[op] = seconds

    COUNTERS = (
        "enroll_attempts", "polls", "polls_empty", "polls_in_flight", "commands_received", "commands_redelivered",
        "results_posted", "results_accepted", "heartbeats", "telemetry_batches", "telemetry_records",
        "telemetry_duplicates", "inventories",
    )

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.COUNTERS}
        out["errors"] = dict(self.errors)
        out["latency_max_ms"] = {op: round(v * 1000, 2) for op, v in self.latency_max.items()}
        return out
