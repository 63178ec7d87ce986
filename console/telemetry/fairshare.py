"""Fair shares of telemetry storage per node.

The console stores a few batches at once (TELEMETRY_CONCURRENCY), the turns going round the
organizations (console.core.asyncdb.FairSlots). Without a node's share, one node sending many
large batches in parallel takes its organization's turns and most of the process, and the other
organizations' agents (heartbeats, polls and results share the process and the database) slow
down with it. So a batch is admitted to wait for a turn only while

- its node has fewer than `node_inflight` batches being stored or waiting for a turn, and
- its node is within its byte rate: a token bucket of `node_bytes_per_s`, `node_burst_bytes` deep
  (a batch larger than the depth needs a full bucket).

A batch that is not admitted is answered 503 with the seconds to wait (Retry-After); agents keep
unaccepted batches on disk and back off, so a refusal loses nothing.

Pure: no clock reads and no I/O; the caller passes the time (the event loop's clock) and runs
admit/release on one thread (the event loop), so no lock is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# How long a batch refused for concurrency should wait: about the time one batch takes to store.
INFLIGHT_RETRY_S = 1.0
# Idle buckets are forgotten beyond this many nodes (a full bucket and nothing in flight carries no state).
MAX_TRACKED_NODES = 10_000


@dataclass(frozen=True)
class Shares:
    node_inflight: int
    node_bytes_per_s: float
    node_burst_bytes: float

    def __post_init__(self):
        if self.node_inflight < 1:
            raise ValueError("node_inflight must be at least 1")
        if self.node_bytes_per_s <= 0 or self.node_burst_bytes <= 0:
            raise ValueError("node_bytes_per_s and node_burst_bytes must be positive")


@dataclass
class _Bucket:
    level: float
    at: float
    inflight: int = 0


@dataclass
class FairShare:
    shares: Shares
    _nodes: dict[int, _Bucket] = field(default_factory=dict)
    _keys: dict[str, int] = field(default_factory=dict)  # credential key -> node, learned when admitted

    def admit(self, node_id: int, size: int, now: float, key: str = "") -> float:
        """0.0 when the batch may be stored now (then `release` it when done); otherwise the
        seconds to wait before sending it again (nothing is taken). `key` (the credential's public
        key part) lets `busy` recognise the node's next requests before they are read."""
        shares = self.shares
        if key:
            self._keys[key] = node_id
        bucket = self._nodes.get(node_id)
        if bucket is None:
            self._forget_idle(now)
            bucket = self._nodes[node_id] = _Bucket(level=shares.node_burst_bytes, at=now)
        bucket.level = min(shares.node_burst_bytes, bucket.level + (now - bucket.at) * shares.node_bytes_per_s)
        bucket.at = now
        if bucket.inflight >= shares.node_inflight:
            return INFLIGHT_RETRY_S
        needed = min(float(size), shares.node_burst_bytes)
        if bucket.level < needed:
            return (needed - bucket.level) / shares.node_bytes_per_s
        bucket.level -= size  # may go below zero: a batch larger than the depth is paid for afterwards
        bucket.inflight += 1
        return 0.0

    def release(self, node_id: int) -> None:
        """The admitted batch of this node is done (stored or failed)."""
        bucket = self._nodes.get(node_id)
        if bucket is not None and bucket.inflight > 0:
            bucket.inflight -= 1

    def busy(self, key: str) -> bool:
        """True when the node that `key` was admitted for has all its batches in flight: its next
        one can be refused on its headers, before its body is read. (A stranger presenting the key
        gains nothing: only an authenticated, admitted batch counts.)"""
        bucket = self._nodes.get(self._keys.get(key, -1))
        return bucket is not None and bucket.inflight >= self.shares.node_inflight

    def _forget_idle(self, now: float) -> None:
        if len(self._nodes) < MAX_TRACKED_NODES:
            return
        shares = self.shares
        for node_id, bucket in list(self._nodes.items()):
            refilled = bucket.level + (now - bucket.at) * shares.node_bytes_per_s
            if bucket.inflight == 0 and refilled >= shares.node_burst_bytes:
                del self._nodes[node_id]
        self._keys = {key: node for key, node in self._keys.items() if node in self._nodes}
