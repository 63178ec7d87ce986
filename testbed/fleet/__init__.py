"""A simulated fleet: thousands of lightweight agents in one process, speaking the real agent
protocol over HTTP to a real console (docs/agent-protocol.md). For console load tests and the
long-poll capacity benchmark (bench/longpoll). `python -m testbed.fleet --help` for the CLI."""

from .agent import SimAgent
from .fleet import BackgroundFleet, Fleet, FleetConfig
from .stats import AgentStats, Histogram

__all__ = ["AgentStats", "BackgroundFleet", "Fleet", "FleetConfig", "Histogram", "SimAgent"]
