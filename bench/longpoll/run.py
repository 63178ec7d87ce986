"""One benchmark level: a fresh database, one console process, a simulated fleet, commands injected.

Phases, for N agents:

1. **setup**: database `<db>` (from a migrated template), Redis db `<redis-db>` flushed, one
   console (uvicorn, PostgreSQL + Redis), an organization (`create_organization`), a cluster
   and an enrollment token through the REST API.
2. **ramp**: the fleet process starts; every agent enrolls (as its own node), puts its inventory
   and starts long-polling. Done when the console holds N polls.
3. **hold** (`--duration`): commands are injected at `--rate` per second through
   `POST /api/v1/nodes/{id}/commands/` on random nodes, open loop; the agents also heartbeat and
   post light telemetry concurrently. Measured: polls and TCP connections the console holds,
   delivery latency (POST sent → agent received), telemetry rows ingested, errors, CPU.
4. **ingest** (`--ingest-duration`, optional): the fleet restarts from its saved credentials with
   heavy telemetry (`--ingest-every`, `--ingest-records`, `--ingest-agents`) while commands keep
   being injected: telemetry rows per second the console stores, and delivery latency under it.
5. **cleanup**: fleet and console stopped, database dropped, Redis db flushed (always).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psycopg
import redis

from .system import Child, CpuMeter, established, machine_cpu, postgres_cpu_seconds, rss_bytes

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@dataclass
class Options:
    agents: int
    rate: float = 50.0
    duration: float = 60.0
    warmup: float = 10.0
    telemetry_every: float | None = 60.0
    records: int = 20
    ingest_duration: float = 30.0
    ingest_every: float = 0.0
    ingest_records: int = 100
    ingest_agents: int | None = 50
    inventory_share: float = 0.1
    heartbeat: float | None = None
    poll_wait: float | None = None
    db_name: str = "lockstep_bench"
    pg: str = "postgresql://postgres@127.0.0.1:5432"
    redis_url: str = "redis://127.0.0.1:6379"
    redis_db: int = 5
    port: int = 0
    console_env: dict = field(default_factory=dict)
    ramp_timeout: float = 600.0
    profile: bool = False
    out: Path = Path(".")
    log: Callable[[str], None] = print


@contextlib.contextmanager
def signals_ignored():
    """SIGINT and SIGTERM ignored inside (main thread only), restored after."""
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# --- database and redis ----------------------------------------------------------------------

def _admin(opts: Options):
    return psycopg.connect(f"{opts.pg}/postgres", autocommit=True)


def drop_database(opts: Options, name: str) -> None:
    with _admin(opts) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare_template(opts: Options, env: dict) -> str:
    """A migrated, empty database to copy for each level (migrating takes a while)."""
    template = f"{opts.db_name}_template"
    drop_database(opts, template)
    with _admin(opts) as conn:
        conn.execute(f'CREATE DATABASE "{template}"')
    out = _run_manage(["migrate", "--noinput"], {**env, "DATABASE_URL": f"{opts.pg}/{template}"})
    opts.log(f"  migrated template database {template} ({out.count('Applying')} migrations)")
    return template


def create_database(opts: Options, template: str) -> None:
    drop_database(opts, opts.db_name)
    with _admin(opts) as conn:
        conn.execute(f'CREATE DATABASE "{opts.db_name}" TEMPLATE "{template}"')


def flush_redis(opts: Options) -> None:
    client = redis.Redis.from_url(f"{opts.redis_url}/{opts.redis_db}")
    try:
        client.flushdb()
    finally:
        client.close()


def _run_manage(argv: list[str], env: dict) -> str:
    import subprocess

    done = subprocess.run([PY, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def console_env(opts: Options) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "DJANGO_"))}
    env.update(
        DATABASE_URL=f"{opts.pg}/{opts.db_name}",
        REDIS_URL=f"{opts.redis_url}/{opts.redis_db}",
        SECRET_KEY="bench-" + secrets.token_urlsafe(32),
        DEBUG="false", LOCKSTEP_HTTPS="false", ALLOWED_HOSTS="127.0.0.1,localhost",
        LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1", LOCKSTEP_VAR_DIR=str(opts.out / "var"),
        # Under ASGI every REST request runs in a thread of its own: a persistent connection per
        # request would pile up until PostgreSQL refuses clients. Agent endpoints keep theirs
        # on the DB thread pool (console/core/asyncdb.py) whatever this says.
        DB_CONN_MAX_AGE="0",
    )
    env.update({k: str(v) for k, v in opts.console_env.items()})
    return env


# --- measurements ----------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q / 100) - 1))]


def dist_ms(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    return {"count": len(values), "p50_ms": round(percentile(values, 50) * 1000, 1),
            "p90_ms": round(percentile(values, 90) * 1000, 1), "p99_ms": round(percentile(values, 99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1)}


class Sampler:
    """Once a second: the console's stats route, its TCP connections, its memory."""

    def __init__(self, session: aiohttp.ClientSession, base: str, port: int, pid: int) -> None:
        self.session, self.base, self.port, self.pid = session, base, port, pid
        self.samples: list[dict] = []

    async def one(self) -> dict:
        started = time.monotonic()
        try:
            async with self.session.get(f"{self.base}/__bench__/stats",
                                        timeout=aiohttp.ClientTimeout(total=10)) as resp:
                sample = await resp.json()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            sample = {"error": repr(exc)}
        sample["stats_ms"] = round((time.monotonic() - started) * 1000, 1)
        sample["connections"] = established(self.port)
        sample["rss_mb"] = round((rss_bytes(self.pid) or 0) / 2**20, 1)
        sample["t"] = time.time()
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append(await self.one())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    def summary(self) -> dict:
        good = [s for s in self.samples if "error" not in s]
        out = {"samples": len(self.samples), "stats_errors": len(self.samples) - len(good)}
        for key in ("polls_in_flight", "poll_waiters", "connections", "requests_in_flight", "db_queue", "delivery_queue"):
            values = [s[key] for s in good if key in s]
            if values:
                out[key] = {"min": min(values), "mean": round(sum(values) / len(values), 1), "max": max(values)}
        lags = [s["loop_lag_max_ms"] for s in good]
        if lags:
            out["loop_lag_ms"] = {"p50": percentile(lags, 50), "max": max(lags)}
        out["rss_mb_max"] = max((s["rss_mb"] for s in good), default=None)
        return out


class Injector:
    """Commands at a steady rate through the REST API, open loop (a slow answer does not slow it)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, api_token: str, node_ids: list[int],
                 rate: float, inventory_share: float, seed: int = 1) -> None:
        self.session, self.base, self.node_ids, self.rate = session, base, node_ids, rate
        self.headers = {"Authorization": f"Bearer {api_token}"}
        self.inventory_share = inventory_share
        self.rng = random.Random(seed)
        self.sent: list[dict] = []
        self.behind_max = 0.0

    async def _post(self, record: dict) -> None:
        record["sent"] = time.time()
        try:
            async with self.session.post(f"{self.base}/api/v1/nodes/{record['node']}/commands/",
                                         json={"type": record["type"]}, headers=self.headers,
                                         timeout=aiohttp.ClientTimeout(total=30)) as resp:
                record["status"] = resp.status
                body = await resp.json(content_type=None)
                if resp.status == 201:
                    record["id"] = body["id"]
                    record["created"] = body["created"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            record["status"] = type(exc).__name__
        record["answered"] = time.time()

    async def run(self, duration: float) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        total = int(duration * self.rate)
        tasks = []
        for i in range(total):
            due = start + i / self.rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.behind_max = max(self.behind_max, -delay)
            kind = "inventory.refresh" if self.rng.random() < self.inventory_share else "node.health"
            record = {"node": self.rng.choice(self.node_ids), "type": kind}
            self.sent.append(record)
            tasks.append(loop.create_task(self._post(record)))
        if tasks:
            await asyncio.gather(*tasks)

    def ids(self) -> list[str]:
        return [r["id"] for r in self.sent if "id" in r]


def _parse_iso(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def delivery(injector: Injector, receipts: list[dict]) -> dict:
    """Latency from the POST being sent (and from the command row's creation) to the agent receiving it."""
    first: dict[str, float] = {}
    for r in receipts:
        if r["id"] not in first or r["received"] < first[r["id"]]:
            first[r["id"]] = r["received"]
    from_post, from_created, missing = [], [], 0
    for rec in injector.sent:
        cid = rec.get("id")
        if cid is None:
            continue
        got = first.get(cid)
        if got is None:
            missing += 1
            continue
        from_post.append(got - rec["sent"])
        from_created.append(got - _parse_iso(rec["created"]))
    statuses: dict[str, int] = {}
    for rec in injector.sent:
        statuses[str(rec.get("status"))] = statuses.get(str(rec.get("status")), 0) + 1
    api = [rec["answered"] - rec["sent"] for rec in injector.sent if rec.get("status") == 201]
    return {
        "injected": len(injector.sent), "api_status": statuses, "api_latency": dist_ms(api),
        "injector_behind_max_s": round(injector.behind_max, 3),
        "delivered": len(from_post), "undelivered": missing,
        "from_post": dist_ms(from_post), "from_created": dist_ms(from_created),
    }


# --- the fleet process -----------------------------------------------------------------------

def fleet_progress(log: Path) -> list[dict]:
    """The JSON progress lines the fleet printed (one per --stats-every)."""
    lines = []
    with contextlib.suppress(FileNotFoundError), open(log, errors="replace") as fh:
        for line in fh:
            if line.startswith('{"t":'):
                with contextlib.suppress(ValueError):
                    lines.append(json.loads(line))
    return lines


def progress_at(lines: list[dict], t: float) -> dict | None:
    before = [line for line in lines if line["t"] <= t]
    return before[-1] if before else (lines[0] if lines else None)


def errors_between(lines: list[dict], t0: float, t1: float) -> dict:
    a, b = progress_at(lines, t0), progress_at(lines, t1)
    if not a or not b:
        return {}
    ea, eb = a["totals"]["errors"], b["totals"]["errors"]
    return {k: eb[k] - ea.get(k, 0) for k in eb if eb[k] - ea.get(k, 0)}


def start_fleet(opts: Options, name: str, base: str, token: str, cluster_id: int, state: Path, report: Path,
                telemetry_every: float | None, records: int, telemetry_agents: int | None) -> Child:
    argv = [PY, "-m", "testbed.fleet", "run", "--console", base, "--token", token, "--agents", str(opts.agents),
            "--cluster", str(cluster_id), "--prefix", "bench", "--state", str(state), "--report", str(report),
            "--stats-every", "1", "--enroll-concurrency", "8", "--records", str(records)]
    if telemetry_every is not None:
        argv += ["--telemetry-every", f"{telemetry_every:g}"]
    if telemetry_agents is not None:
        argv += ["--telemetry-agents", str(telemetry_agents)]
    if opts.heartbeat is not None:
        argv += ["--heartbeat", f"{opts.heartbeat:g}"]
    if opts.poll_wait is not None:
        argv += ["--poll-wait", f"{opts.poll_wait:g}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return Child(name, argv, env, opts.out / f"{name}.log", ROOT)


async def wait_until(what: str, timeout: float, check, interval: float = 1.0, log=None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last is True or (last and not isinstance(last, (str, dict))):
            return last
        if log and isinstance(last, str):
            log(last)
        await asyncio.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last})")


# --- one level -------------------------------------------------------------------------------

class Level:
    def __init__(self, opts: Options, template: str) -> None:
        self.opts, self.template = opts, template
        self.children: list[Child] = []
        self.result: dict = {"agents": opts.agents}

    def _cleanup(self) -> None:
        with signals_ignored():  # a second Ctrl-C / SIGTERM must not leave processes or databases behind
            for child in reversed(self.children):
                child.stop(signal.SIGTERM, timeout=20)
            with contextlib.suppress(Exception):
                drop_database(self.opts, self.opts.db_name)
            with contextlib.suppress(Exception):
                flush_redis(self.opts)

    async def run(self) -> dict:
        try:
            return await self._run()
        finally:
            self._cleanup()

    async def _pg(self, sql: str, params=()):
        def query():
            with psycopg.connect(f"{self.opts.pg}/{self.opts.db_name}", autocommit=True) as conn:
                return conn.execute(sql, params).fetchall()

        return await asyncio.to_thread(query)

    async def _telemetry_rows(self) -> int:
        return (await self._pg("SELECT count(*) FROM telemetry_telemetryrecord"))[0][0]

    async def _run(self) -> dict:
        opts, log = self.opts, self.opts.log
        create_database(opts, self.template)
        flush_redis(opts)
        env = console_env(opts)
        port = opts.port or _free_port()
        base = f"http://127.0.0.1:{port}"
        console = Child("console", [PY, "-m", "uvicorn", "bench.longpoll.console_app:application", "--host",
                                    "127.0.0.1", "--port", str(port), "--lifespan", "off", "--no-access-log",
                                    "--backlog", "8192", "--log-level", "warning"],
                        env, opts.out / "console.log", ROOT)
        self.children.append(console)
        api_token = (await asyncio.to_thread(_run_manage, ["create_organization", "Bench",
                                                           "--admin-email", "bench@example.test"], env)
                     ).strip().splitlines()[-1]
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)
        async with aiohttp.ClientSession(connector=connector) as session:
            headers = {"Authorization": f"Bearer {api_token}"}

            async def healthy():
                if not console.alive():
                    raise RuntimeError(f"the console exited:\n{console.tail()}")
                try:
                    async with session.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        return r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    return False

            await wait_until("the console to start", 60, healthy, 0.2)
            async with session.post(f"{base}/api/v1/clusters/", json={"name": f"bench-{opts.agents}"},
                                    headers=headers) as r:
                cluster_id = (await r.json())["id"]
            async with session.post(f"{base}/api/v1/clusters/{cluster_id}/enrollment-tokens/",
                                    json={"description": "bench", "max_uses": None}, headers=headers) as r:
                body = await r.json()
                if r.status != 201:
                    raise RuntimeError(f"enrollment token: {r.status} {body}")
                token = body["token"]
            log(f"  console pid {console.pid} at {base}; cluster {cluster_id}")
            sampler = Sampler(session, base, port, console.pid)
            state = opts.out / "fleet-state.json"

            # -- ramp ---------------------------------------------------------------------------
            t_ramp = time.monotonic()
            fleet = start_fleet(opts, "fleet-hold", base, token, cluster_id, state, opts.out / "fleet-hold.json",
                                opts.telemetry_every, opts.records, None)
            self.children.append(fleet)
            await self._wait_held(sampler, fleet, "ramp")
            self.result["ramp_s"] = round(time.monotonic() - t_ramp, 1)
            log(f"  ramp: {opts.agents} agents enrolled and polling after {self.result['ramp_s']} s")
            node_ids = [r[0] for r in await self._pg("SELECT id FROM fleet_node WHERE cluster_id = %s", (cluster_id,))]
            await asyncio.sleep(opts.warmup)

            # -- hold ---------------------------------------------------------------------------
            self.result["hold"] = await self._measure(
                "hold", session, sampler, base, api_token, node_ids, console, fleet, opts.duration)
            fleet.stop(signal.SIGINT, timeout=120)
            self._finish_phase("hold", fleet, opts.out / "fleet-hold.json")

            # -- ingest -------------------------------------------------------------------------
            if opts.ingest_duration > 0:
                fleet = start_fleet(opts, "fleet-ingest", base, token, cluster_id, state,
                                    opts.out / "fleet-ingest.json", opts.ingest_every, opts.ingest_records,
                                    opts.ingest_agents)
                self.children.append(fleet)
                await self._wait_held(sampler, fleet, "ingest restart")
                await asyncio.sleep(min(5.0, opts.warmup))
                self.result["ingest"] = await self._measure(
                    "ingest", session, sampler, base, api_token, node_ids, console, fleet, opts.ingest_duration)
                fleet.stop(signal.SIGINT, timeout=120)
                self._finish_phase("ingest", fleet, opts.out / "fleet-ingest.json")
        return self.result

    async def _wait_held(self, sampler: Sampler, fleet: Child, what: str) -> None:
        n = self.opts.agents
        t0 = time.monotonic()
        last_print = [0.0]

        async def held():
            if not fleet.alive():
                raise RuntimeError(f"the fleet exited during {what}:\n{fleet.tail()}")
            sample = await sampler.one()
            polls = sample.get("polls_in_flight", 0)
            self.result["ramp_max_held"] = max(self.result.get("ramp_max_held", 0), polls)
            if polls >= n:
                return True
            if time.monotonic() - last_print[0] > 10:
                last_print[0] = time.monotonic()
                progress = fleet_progress(fleet.log)
                agents = progress[-1]["agents"] if progress else {}
                return f"  {what}: {time.monotonic() - t0:.0f}s, console holds {polls} polls; fleet {agents}"
            return False

        await wait_until(f"{n} polls held ({what})", self.opts.ramp_timeout, held, 0.5, log=self.opts.log)

    async def _measure(self, phase: str, session, sampler: Sampler, base: str, api_token: str, node_ids: list[int],
                       console: Child, fleet: Child, duration: float) -> dict:
        opts, log = self.opts, self.opts.log
        sampler.samples = []
        stop = asyncio.Event()
        sampling = asyncio.get_running_loop().create_task(sampler.run(stop))
        meters = {name: CpuMeter() for name in ("console", "fleet")}
        meters["console"].start([console.pid])
        meters["fleet"].start([fleet.pid])
        pg0, wall0 = postgres_cpu_seconds(), time.monotonic()
        busy0, total0 = machine_cpu()
        rows0, t0 = await self._telemetry_rows(), time.time()
        profiler = None
        if opts.profile and phase == "hold":
            profiler = _start_profiler(opts, console.pid, duration)
        injector = Injector(session, base, api_token, node_ids, opts.rate, opts.inventory_share)
        await injector.run(duration)
        rows1, t1 = await self._telemetry_rows(), time.time()
        busy1, total1 = machine_cpu()
        cpu = {"console_cores": round(meters["console"].stop([console.pid]), 2),
               "fleet_cores": round(meters["fleet"].stop([fleet.pid]), 2),
               "postgres_cores": round(((postgres_cpu_seconds() or 0) - (pg0 or 0)) / (time.monotonic() - wall0), 2),
               "machine_busy_pct": round(100 * (busy1 - busy0) / max(total1 - total0, 1), 1)}
        stop.set()
        await sampling
        # Deliveries still on their way: wait for every injected command to leave 'pending'.
        ids = injector.ids()
        with contextlib.suppress(RuntimeError):
            async def delivered():
                rows = await self._pg("SELECT count(*) FROM commands_command WHERE id = ANY(%s) AND state = 'pending'",
                                      (ids,))
                return rows[0][0] == 0
            await wait_until("the last commands to be delivered", 30, delivered, 0.5)
        await asyncio.sleep(1.0)
        states = dict(await self._pg("SELECT state, count(*) FROM commands_command WHERE id = ANY(%s) GROUP BY 1",
                                     (ids,)))
        if profiler is not None:
            profiler.stop(signal.SIGINT, timeout=60)
        result = {
            "duration_s": round(t1 - t0, 1), "rate": opts.rate, "cpu": cpu, "console": sampler.summary(),
            "telemetry_rows": rows1 - rows0, "telemetry_rows_per_s": round((rows1 - rows0) / (t1 - t0), 1),
            "command_states": states, "window": [t0, t1],
        }
        self._injector = injector
        log(f"  {phase}: {duration:.0f}s at {opts.rate}/s; console {cpu['console_cores']} cores, "
            f"postgres {cpu['postgres_cores']}, fleet {cpu['fleet_cores']}, machine {cpu['machine_busy_pct']}%; "
            f"telemetry {result['telemetry_rows_per_s']} rows/s")
        return result

    def _finish_phase(self, phase: str, fleet: Child, report_path: Path) -> None:
        result = self.result[phase]
        try:
            report = json.loads(report_path.read_text())
        except (FileNotFoundError, ValueError) as exc:
            raise RuntimeError(f"the fleet wrote no report ({exc}):\n{fleet.tail()}") from None
        result["delivery"] = delivery(self._injector, report["receipts"])
        progress = fleet_progress(fleet.log)
        t0, t1 = result.pop("window")
        result["fleet_errors_in_window"] = errors_between(progress, t0, t1)
        result["fleet_errors_total"] = report["totals"]["errors"]
        result["fleet_agents"] = report["agents"]
        result["fleet_latency"] = report["latency"]
        result["fleet_totals"] = {k: v for k, v in report["totals"].items() if k != "errors"}
        d = result["delivery"]
        self.opts.log(f"  {phase}: delivered {d['delivered']}/{d['injected']} "
                      f"p50 {d['from_post'].get('p50_ms')} ms p99 {d['from_post'].get('p99_ms')} ms "
                      f"max {d['from_post'].get('max_ms')} ms; errors {result['fleet_errors_in_window']}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_profiler(opts: Options, pid: int, duration: float) -> Child | None:
    import shutil

    pyspy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    if not Path(pyspy).exists():
        opts.log("  --profile: py-spy not found (pip install py-spy); not profiling")
        return None
    out = opts.out / "console-profile.txt"
    opts.log(f"  profiling the console with py-spy into {out} (collapsed stacks; summarize: "
             f"python -m bench.longpoll.profile {out})")
    return Child("py-spy", [pyspy, "record", "--pid", str(pid), "--duration", str(int(duration)), "--rate", "20",
                            "--format", "raw", "--output", str(out), "--nonblocking", "--threads"],
                 dict(os.environ), opts.out / "py-spy.log", ROOT)
