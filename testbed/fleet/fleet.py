"""A fleet of simulated agents in one process: one aiohttp session, one coroutine group per agent.

    config = FleetConfig(console="http://127.0.0.1:8000", token="lse_...", agents=2000)
    report = asyncio.run(Fleet(config).run(duration=60))          # or, step by step:

    async with Fleet(config) as fleet:
        fleet.start()
        await fleet.wait_for(lambda s: s["agents"]["running"] == config.agents, 120, "all agents running")
        ...
        fleet.snapshot()                                           # counters, right now
    fleet.report()                                                 # after stop: everything

From synchronous code (a test), `BackgroundFleet` runs the same in a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from .agent import SimAgent
from .stats import Histogram

OPS = ("enroll", "inventory", "poll", "heartbeat", "result", "telemetry")


@dataclass
class FleetConfig:
    """What to simulate. Durations in seconds; None means "what the console says" (heartbeat
    interval, poll wait) or "off" (telemetry)."""

    console: str
    token: str
    agents: int
    cluster_id: int | None = None
    prefix: str = "sim"
    first_index: int = 0
    heartbeat_s: float | None = None
    poll_wait_s: float | None = None
    poll_max: int = 10
    telemetry_every_s: float | None = None  # None: no telemetry; 0: batches back to back
    records: int = 10
    telemetry_agents: int | None = None  # only the first K agents post telemetry (None: all)
    inventory_on_enroll: bool = True
    gpus: int = 8
    rails: int = 2
    command_time_s: float = 0.0
    enroll_concurrency: int = 16
    request_timeout_s: float = 30.0
    result_attempts: int = 5
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    keepalive_s: float = 3.0  # below the server's idle timeout (uvicorn: 5 s), so no stale reuse
    state_file: str | None = None
    seed: int = 0
    names: list[str] | None = None  # hostnames to use instead of prefix + index (e.g. a topology's)

    def __post_init__(self) -> None:
        if self.agents < 0:
            raise ValueError("agents must be ≥ 0")
        if not self.token and not self.state_file:
            raise ValueError("an enrollment token is needed (or a state file of enrolled agents)")
        if self.names is not None and len(self.names) != self.agents:
            raise ValueError(f"names: {len(self.names)} hostnames for {self.agents} agents")
        self.console = self.console.rstrip("/")


class Fleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.base_url = config.console
        self.session: aiohttp.ClientSession | None = None
        self.enroll_gate = asyncio.Semaphore(max(1, config.enroll_concurrency))
        self.histograms = {op: Histogram() for op in OPS}
        self.receipts: list[dict] = []
        self.polls_in_flight = 0
        self.started_at: float | None = None  # wall clock
        self.stopped_at: float | None = None
        self.first_running: float | None = None
        self.all_running: float | None = None
        self._running = 0
        self._tasks: list[asyncio.Task] = []
        self.telemetry_stopping = asyncio.Event()
        saved = _load_state(config.state_file, config.prefix)
        self.agents = [
            SimAgent(self, i, saved.get(hostname_for(config, i)))
            for i in range(config.first_index, config.first_index + config.agents)
        ]

    async def __aenter__(self) -> Fleet:
        await self.open()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    async def open(self) -> None:
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=self.config.keepalive_s,
                                             ttl_dns_cache=None)
            self.session = aiohttp.ClientSession(connector=connector, raise_for_status=False,
                                                 headers={"User-Agent": "lockstep-fleet-sim/0.1"})

    def start(self) -> None:
        """Start every agent (they enroll, then poll); returns at once."""
        if self.session is None:
            raise RuntimeError("open() the fleet (or use `async with`) before start()")
        loop = asyncio.get_running_loop()
        self.started_at = time.time()
        self._tasks = [loop.create_task(agent.run(), name=agent.hostname) for agent in self.agents]

    async def stop(self) -> None:
        """Stop every agent, close the connections, save the state file."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.started_at is not None and self.stopped_at is None:
            self.stopped_at = time.time()
        if self.config.state_file:
            _save_state(self.config.state_file, self.config.prefix, self.agents)

    async def run(self, duration: float | None = None, stop: asyncio.Event | None = None,
                  stats_every: float | None = None, out=None) -> dict:
        """Run until `duration` seconds pass or `stop` is set; print a snapshot line (JSON) to
        `out` every `stats_every` seconds; return the report."""
        stop = stop or asyncio.Event()
        async with self:
            self.start()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + duration if duration else None
            tick = stats_every or 1.0
            next_print = loop.time() + tick
            while not stop.is_set():
                now = loop.time()
                if deadline is not None and now >= deadline:
                    break
                timeout = min(next_print, deadline or next_print) - now
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(timeout, 0.01))
                if stats_every and out is not None and loop.time() >= next_print:
                    out.write(json.dumps(self.snapshot(brief=True)) + "\n")
                    out.flush()
                    next_print += tick
        return self.report()

    async def stop_telemetry(self) -> None:
        """Let every agent finish the telemetry batch it is posting, then post no more (so the
        agents' counters and the console's rows can be compared exactly)."""
        self.telemetry_stopping.set()
        tasks = [a.telemetry_task for a in self.agents if a.telemetry_task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.1) -> dict:
        """Wait until predicate(snapshot()) is true; AssertionError naming `what` after `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            snap = self.snapshot()
            if predicate(snap):
                return snap
            if loop.time() >= deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; fleet: {snap['agents']}, "
                                     f"errors: {snap['totals']['errors']}")
            await asyncio.sleep(interval)

    # --- called by agents -----------------------------------------------------------------------

    def pause(self, hostname: str) -> None:
        """Silence one agent (a frozen host): no polls, heartbeats or telemetry until resume()."""
        for i, agent in enumerate(self.agents):
            if agent.hostname == hostname:
                self._tasks[i].cancel()
                agent.state = "paused"
                return
        raise KeyError(f"no simulated agent named {hostname!r}")

    def resume(self, hostname: str) -> None:
        """Start a paused agent again with its credential (no new enrollment)."""
        for i, agent in enumerate(self.agents):
            if agent.hostname == hostname:
                if self._tasks[i].done():
                    self._tasks[i] = asyncio.get_running_loop().create_task(agent.run(), name=agent.hostname)
                return
        raise KeyError(f"no simulated agent named {hostname!r}")

    def observe(self, op: str, seconds: float) -> None:
        self.histograms[op].add(seconds)

    def agent_running(self, agent: SimAgent) -> None:
        self._running += 1
        now = time.time()
        if self.first_running is None:
            self.first_running = now
        if self._running == len(self.agents):
            self.all_running = now

    def record_receipt(self, agent: SimAgent, command: dict, received: float) -> None:
        self.receipts.append({
            "id": str(command.get("id")), "type": command.get("type"), "attempt": command.get("attempt"),
            "node_id": agent.node_id, "agent": agent.hostname, "received": received,
        })

    # --- reporting ------------------------------------------------------------------------------

    def snapshot(self, brief: bool = False) -> dict:
        states = Counter(agent.state for agent in self.agents)
        totals: Counter = Counter()
        errors: Counter = Counter()
        for agent in self.agents:
            stats = agent.stats
            for name in stats.COUNTERS:
                totals[name] += getattr(stats, name)
            errors.update(stats.errors)
        agents = {"total": len(self.agents), **{s: states.get(s, 0) for s in
                                                 ("new", "enrolling", "running", "stopped", "failed")}}
        snap = {"t": round(time.time(), 3), "agents": agents, "polls_in_flight": self.polls_in_flight,
                "totals": {**totals, "errors": dict(sorted(errors.items()))}}
        if not brief:
            snap["latency"] = {op: h.summary() for op, h in self.histograms.items() if h.count}
        return snap

    def report(self, per_agent: bool = True) -> dict:
        """Everything: config, counters, latencies, command receipts and (optionally) each agent."""
        snap = self.snapshot()
        config = {k: v for k, v in asdict(self.config).items() if k != "token"}
        report = {
            "config": config, "started_at": self.started_at, "stopped_at": self.stopped_at,
            "first_running_at": self.first_running, "all_running_at": self.all_running,
            "agents": snap["agents"], "totals": snap["totals"], "latency": snap["latency"],
            "stopped_reasons": dict(Counter(a.reason for a in self.agents if a.reason)),
            "receipts": self.receipts,
        }
        if per_agent:
            report["per_agent"] = [agent.summary() for agent in self.agents]
        return report


def hostname_for(config: FleetConfig, index: int) -> str:
    from .payloads import hostname

    if config.names is not None:
        return config.names[index - config.first_index]
    return hostname(config.prefix, index)


def _load_state(path: str | None, prefix: str) -> dict:
    if not path or not os.path.exists(path):
        return {}
    data = json.loads(Path(path).read_text())
    if data.get("prefix") != prefix:
        raise ValueError(f"state file {path} is for prefix {data.get('prefix')!r}, not {prefix!r}")
    return data.get("agents", {})


def _save_state(path: str, prefix: str, agents: list[SimAgent]) -> None:
    """Credentials and telemetry seq of enrolled agents (a real agent keeps both on disk)."""
    known = _load_state(path, prefix)
    known.update({agent.hostname: agent.saved() for agent in agents if agent.credential})
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"prefix": prefix, "agents": known}, fh)
    os.replace(tmp, path)


class BackgroundFleet:
    """A fleet running on its own event loop in a thread, for synchronous callers (tests).

        with BackgroundFleet(config) as fleet:
            fleet.wait_for(lambda s: s["agents"]["running"] == 20, 60, "20 agents running")
            fleet.snapshot(); fleet.agent_summaries()
        fleet.final_report
    """

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.fleet: Fleet | None = None
        self.final_report: dict | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fleet", daemon=True)

    def __enter__(self) -> BackgroundFleet:
        self._thread.start()

        async def begin():
            self.fleet = Fleet(self.config)
            await self.fleet.open()
            self.fleet.start()

        self._run(begin())
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _run(self, coro, timeout: float | None = 60):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn):
        """fn(fleet) on the fleet's loop; its result."""
        async def inside():
            return fn(self.fleet)

        return self._run(inside())

    def snapshot(self) -> dict:
        return self.call(lambda f: f.snapshot())

    def agent_summaries(self) -> list[dict]:
        return self.call(lambda f: [a.summary() for a in f.agents])

    def receipts(self) -> list[dict]:
        return self.call(lambda f: list(f.receipts))

    def stop_telemetry(self, timeout: float = 120) -> None:
        async def inside():
            await self.fleet.stop_telemetry()

        self._run(inside(), timeout)

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.1) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if predicate(snap):
                return snap
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; fleet: {snap['agents']}, "
                                     f"errors: {snap['totals']['errors']}")
            time.sleep(interval)

    def stop(self) -> dict | None:
        if self.final_report is None and self._thread.is_alive():
            async def end():
                await self.fleet.stop()
                return self.fleet.report()

            try:
                self.final_report = self._run(end(), timeout=120)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(30)
                self._loop.close()
        return self.final_report
