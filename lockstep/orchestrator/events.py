"""The event kinds the orchestrator sends the node's Lockstep agent (through
``lockstep.events.AgentEvents``, the local socket's one sender).

``job.heartbeat`` (every ``heartbeat_s``: per-rank step and step time, at most 256 ranks an
event, so a larger job sends several, each with ``world_size``), ``job.rank_lost``,
``job.migration_started``, ``job.migration_finished``, ``job.snapshot``.
"""

from __future__ import annotations

# The kinds the console registers (docs/agent-protocol.md); the journal keeps others (job.failed).
AGENT_KINDS = frozenset({"job.heartbeat", "job.rank_lost", "job.migration_started", "job.migration_finished",
                         "job.snapshot"})
