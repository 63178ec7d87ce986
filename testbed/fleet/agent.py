"""One simulated node agent: a few coroutines speaking the real agent protocol.

It enrolls with its own hostname and machine-id, puts its inventory, then runs three loops
until stopped: the long poll for commands (answering each one with a result), heartbeats, and
(when configured) telemetry batches with an increasing `seq`. Failed requests are retried with
exponential backoff and full jitter; a refused credential (401) or a retired node (403) stops
the agent, as docs/agent-protocol.md asks of real agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import TYPE_CHECKING

import aiohttp

from agent.backoff import Backoff, retry_after_s

from . import payloads
from .stats import AgentStats

if TYPE_CHECKING:
    from .fleet import Fleet

ENROLL_FATAL = {400, 401, 403, 409}


class Transient(Exception):
    """No usable answer (timeout, refused connection, a 5xx or 429): try again later, and not
    before `retry_after_s` seconds when the console said so."""

    def __init__(self, message: str, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AgentHalted(Exception):
    """The console told this agent to stop (credential refused, node retired, enrollment refused)."""


class SimAgent:
    """A simulated agent. State: new → enrolling → running → stopped (told to stop) or failed
    (enrollment refused); `reason` says why it is not running."""

    def __init__(self, fleet: Fleet, index: int, saved: dict | None = None) -> None:
        cfg = fleet.config
        self.fleet = fleet
        self.index = index
        self.hostname = cfg.names[index - cfg.first_index] if cfg.names else payloads.hostname(cfg.prefix, index)
        self.machine_id = payloads.machine_id(cfg.prefix, index)
        self.rng = random.Random(f"{cfg.seed}:{self.hostname}")
        self.stats = AgentStats()
        self.state = "new"
        self.reason = ""
        self.node_id: int | None = None
        self.credential: str | None = None
        self.seq = 0  # the last telemetry seq the console accepted (or refused as a duplicate)
        self.heartbeat_s = cfg.heartbeat_s
        self.poll_wait_s = cfg.poll_wait_s
        self.started = time.monotonic()
        self.completed: dict[str, dict] = {}  # command id → the result body posted for it
        self.running_commands = 0
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self.telemetry_task: asyncio.Task | None = None
        if saved:
            self.node_id, self.credential, self.seq = saved.get("node_id"), saved.get("credential"), saved.get("seq", 0)

    # --- plumbing ---------------------------------------------------------------------------

    async def _call(self, op: str, method: str, path: str, *, body=None, params=None, timeout: float,
                    auth: bool = True) -> tuple[int, dict]:
        """One request; (status, JSON body). Transient when there is no usable answer."""
        fleet = self.fleet
        headers = {"Authorization": f"Bearer {self.credential}"} if auth else None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with fleet.session.request(method, fleet.base_url + path, json=body, params=params,
                                             headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                status = response.status
                try:
                    data = await response.json(content_type=None)
                except ValueError:
                    data = None
        except asyncio.TimeoutError:
            self.stats.errors[f"{op}:timeout"] += 1
            raise Transient(f"{op}: no answer within {timeout:.0f}s") from None
        except aiohttp.ClientError as exc:
            self.stats.errors[f"{op}:connect"] += 1
            raise Transient(f"{op}: {exc!r}") from None
        elapsed = loop.time() - started
        fleet.observe(op, elapsed)
        self.stats.observe(op, elapsed)
        if status >= 400:
            self.stats.errors[f"{op}:{status}"] += 1
            if status >= 500 or status == 429:
                raise Transient(f"{op}: HTTP {status}", retry_after_s(response.headers.get("Retry-After")))
            if status in (401, 403) and auth:
                code = data.get("error", "") if isinstance(data, dict) else ""
                self._halt("stopped", f"{op} answered {status} {code}".strip())
        return status, data if isinstance(data, dict) else {}

    def _halt(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        raise AgentHalted(reason)

    async def _pause(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    def _spawn(self, coro) -> None:
        async def guarded():
            try:
                await coro
            except AgentHalted:  # told to stop while posting a result: stop the loops too
                for task in self._loops:
                    task.cancel()

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- life cycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        cfg = self.fleet.config
        loops = self._loops = []  # a resumed agent starts its loops afresh
        try:
            if self.credential is None:
                await self.enroll()
                if cfg.inventory_on_enroll:
                    await self.put_inventory()
            self.state = "running"
            self.fleet.agent_running(self)
            loop = asyncio.get_running_loop()
            loops += [loop.create_task(self._poll_loop()), loop.create_task(self._heartbeat_loop())]
            if cfg.telemetry_every_s is not None and (cfg.telemetry_agents is None
                                                      or self.index - cfg.first_index < cfg.telemetry_agents):
                self.telemetry_task = loop.create_task(self._telemetry_loop())
                loops.append(self.telemetry_task)
            await asyncio.gather(*loops)
        except AgentHalted:
            pass
        except asyncio.CancelledError:
            if self.state == "running":  # the fleet is stopping: not halted by the console
                raise
        finally:
            for task in [*loops, *self._tasks]:
                task.cancel()
            if loops or self._tasks:
                await asyncio.gather(*loops, *self._tasks, return_exceptions=True)
            if self.state == "running":
                self.state = "stopped"

    async def enroll(self) -> None:
        cfg = self.fleet.config
        self.state = "enrolling"
        body = {"token": cfg.token, "host": payloads.host_facts(self.hostname, self.machine_id)}
        if cfg.cluster_id is not None:
            body["cluster_id"] = cfg.cluster_id
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, self.rng.random)
        while True:
            self.stats.enroll_attempts += 1
            try:
                async with self.fleet.enroll_gate:
                    status, data = await self._call("enroll", "POST", "/api/v1/agent/enroll", body=body,
                                                    timeout=cfg.request_timeout_s, auth=False)
            except Transient as exc:
                await self._pause(backoff.after(exc.retry_after_s))
                continue
            if status == 201:
                break
            if status in ENROLL_FATAL:
                self._halt("failed", f"enrollment refused: {status} {data.get('error', '')}".strip())
            await self._pause(backoff.next_delay())
        self.node_id, self.credential = data["node_id"], data["credential"]
        if self.heartbeat_s is None:
            self.heartbeat_s = float(data.get("heartbeat_interval_s", 15))
        if self.poll_wait_s is None:
            self.poll_wait_s = float(data.get("poll_wait_s", 25))
        self.seq = 0

    async def put_inventory(self) -> None:
        cfg = self.fleet.config
        doc = payloads.inventory(self.hostname, self.machine_id, cfg.gpus, cfg.rails)
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, self.rng.random)
        while True:
            try:
                status, _ = await self._call("inventory", "PUT", "/api/v1/agent/inventory", body=doc,
                                             timeout=cfg.request_timeout_s)
            except Transient as exc:
                await self._pause(backoff.after(exc.retry_after_s))
                continue
            if status == 200:
                self.stats.inventories += 1
            return  # a refused inventory is counted in errors; the agent carries on

    # --- loops ----------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        cfg = self.fleet.config
        wait = self.poll_wait_s if self.poll_wait_s is not None else 25.0
        params = {"wait": f"{wait:g}", "max": str(cfg.poll_max)}
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, self.rng.random)
        while True:
            self.stats.polls_in_flight = 1
            self.fleet.polls_in_flight += 1
            try:
                status, data = await self._call("poll", "GET", "/api/v1/agent/commands", params=params,
                                                timeout=wait + cfg.request_timeout_s)
            except Transient as exc:
                await self._pause(backoff.after(exc.retry_after_s))
                continue
            finally:
                self.stats.polls_in_flight = 0
                self.fleet.polls_in_flight -= 1
            if status != 200:
                await self._pause(backoff.next_delay())
                continue
            backoff.reset()
            self.stats.polls += 1
            commands = data.get("commands") or []
            if not commands:
                self.stats.polls_empty += 1
            received = time.time()
            for command in commands:
                self._receive(command, received)

    def _receive(self, command: dict, received: float) -> None:
        command_id = str(command.get("id"))
        self.stats.commands_received += 1
        self.fleet.record_receipt(self, command, received)
        if command_id in self.completed:
            self.stats.commands_redelivered += 1
            self._spawn(self._post_result(command_id, self.completed[command_id]))
        else:
            self._spawn(self._execute(command))

    async def _execute(self, command: dict) -> None:
        cfg = self.fleet.config
        self.running_commands += 1
        try:
            if cfg.command_time_s:
                await asyncio.sleep(self.rng.uniform(0.5, 1.5) * cfg.command_time_s)
            kind = command.get("type")
            if kind == "node.health":
                body = {"status": "succeeded", "error": "",
                        "result": payloads.health(self.rng, cfg.gpus, cfg.rails, self.uptime())}
            elif kind == "inventory.refresh":
                body = {"status": "succeeded", "error": "",
                        "result": payloads.inventory(self.hostname, self.machine_id, cfg.gpus, cfg.rails)}
            else:
                body = {"status": "failed", "result": None,
                        "error": f"unknown command type {kind!r} (this simulated agent knows node.health "
                                 f"and inventory.refresh)"}
        finally:
            self.running_commands -= 1
        self.completed[str(command.get("id"))] = body
        await self._post_result(str(command.get("id")), body)

    async def _post_result(self, command_id: str, body: dict) -> None:
        cfg = self.fleet.config
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, self.rng.random)
        for _ in range(cfg.result_attempts):
            try:
                status, data = await self._call("result", "POST", f"/api/v1/agent/commands/{command_id}/result",
                                                body=body, timeout=cfg.request_timeout_s)
            except Transient as exc:
                await self._pause(backoff.after(exc.retry_after_s))
                continue
            self.stats.results_posted += 1
            if status == 200 and data.get("accepted"):
                self.stats.results_accepted += 1
            return  # 200 (accepted or a repeat), or a 4xx that a retry will not change
        # Still no answer: the console's lease offers the command again and we re-post then.

    async def _heartbeat_loop(self) -> None:
        cfg = self.fleet.config
        interval = self.heartbeat_s if self.heartbeat_s is not None else 15.0
        backoff = Backoff(cfg.backoff_base_s, min(cfg.backoff_cap_s, interval), self.rng.random)
        await self._pause(self.rng.uniform(0, interval))  # agents do not start in lockstep
        while True:
            body = {"agent_version": payloads.AGENT_VERSION, "uptime_s": round(self.uptime(), 1),
                    "telemetry_buffered": 0, "telemetry_dropped": 0, "commands_running": self.running_commands}
            try:
                status, _ = await self._call("heartbeat", "POST", "/api/v1/agent/heartbeat", body=body,
                                             timeout=cfg.request_timeout_s)
            except Transient as exc:
                await self._pause(backoff.after(exc.retry_after_s))
                continue
            if status == 200:
                self.stats.heartbeats += 1
                backoff.reset()
                await self._pause(interval)
            else:
                await self._pause(backoff.next_delay())

    async def _telemetry_loop(self) -> None:
        cfg = self.fleet.config
        period = cfg.telemetry_every_s or 0.0
        loop = asyncio.get_running_loop()
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, self.rng.random)
        stopping = self.fleet.telemetry_stopping
        await self._idle(self.rng.uniform(0, period), stopping)
        while not stopping.is_set():
            started = loop.time()
            batch = {"seq": self.seq + 1, "dropped": 0,
                     "records": payloads.telemetry_records(self.rng, cfg.records, cfg.rails)}
            while True:  # the same batch until the console has it (its seq makes retries safe)
                try:
                    status, data = await self._call("telemetry", "POST", "/api/v1/agent/telemetry", body=batch,
                                                    timeout=cfg.request_timeout_s)
                except Transient as exc:
                    await self._pause(backoff.after(exc.retry_after_s))
                    continue
                break
            backoff.reset()
            self.seq = batch["seq"]  # accepted, a duplicate, or refused as malformed: not sent again
            if status == 202:
                self.stats.telemetry_batches += 1
                self.stats.telemetry_records += int(data.get("accepted", 0))
            elif status == 200 and data.get("duplicate"):
                self.stats.telemetry_duplicates += 1
            await self._idle(started + period - loop.time(), stopping)

    async def _idle(self, seconds: float, until: asyncio.Event) -> None:
        if seconds > 0 and not until.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(until.wait(), seconds)

    def uptime(self) -> float:
        return time.monotonic() - self.started

    def saved(self) -> dict:
        return {"node_id": self.node_id, "credential": self.credential, "seq": self.seq}

    def summary(self) -> dict:
        return {"hostname": self.hostname, "machine_id": self.machine_id, "node_id": self.node_id,
                "state": self.state, "reason": self.reason, "last_seq": self.seq, **self.stats.as_dict()}
