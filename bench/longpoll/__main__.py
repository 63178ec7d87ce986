"""`python -m bench.longpoll`: agent long-poll capacity of one console process (see run.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import resource
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from .run import Level, Options, console_env, drop_database, flush_redis, prepare_template, signals_ignored

DESCRIPTION = """\
Agent long-poll capacity of one console process on this machine. For each --agents level: a
fresh PostgreSQL database and Redis db, ONE console process (uvicorn, PostgreSQL + Redis), a
simulated fleet (python -m testbed.fleet) in a separate process whose agents enroll, heartbeat,
long-poll and post light telemetry, and commands injected at --rate per second through the REST
API on random nodes. Reports the polls and connections the console holds, command delivery
latency p50/p99 (POST sent -> agent received), telemetry rows stored per second (light and
concurrent during the hold; heavy in a separate ingest phase), errors, and CPU of the console,
its PostgreSQL backends and the fleet. Everything it starts and creates is removed at the end.
"""

EPILOG = """\
examples:
  python -m bench.longpoll                      # the goal: 2,000 agents, 5 commands/s
  python -m bench.longpoll --agents 2000,3000 --rate 20 --ingest-duration 0
  python -m bench.longpoll --agents 2000 --console-env LOCKSTEP_DB_THREADS=4 --profile
"""


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.longpoll", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default="2000", metavar="N[,N...]",
                   help="simulated agents, one level per value, run one after the other (default 2000)")
    p.add_argument("--rate", type=float, default=5.0, help="commands injected per second (default 5)")
    p.add_argument("--duration", type=float, default=40.0, metavar="S", help="hold phase length (default 40)")
    p.add_argument("--warmup", type=float, default=10.0, metavar="S",
                   help="wait after all agents poll, before measuring (default 10)")
    p.add_argument("--telemetry-every", type=float, default=60.0, metavar="S",
                   help="hold phase: each agent posts a telemetry batch every S seconds (default 60; <0: none)")
    p.add_argument("--records", type=int, default=20, help="hold phase: records per batch (default 20)")
    p.add_argument("--ingest-duration", type=float, default=20.0, metavar="S",
                   help="ingest phase length; 0 skips it (default 20)")
    p.add_argument("--ingest-every", type=float, default=0.0, metavar="S",
                   help="ingest phase: batch period per posting agent, 0 = back to back (default 0)")
    p.add_argument("--ingest-records", type=int, default=100, help="ingest phase: records per batch (default 100)")
    p.add_argument("--ingest-agents", type=int, default=50,
                   help="ingest phase: how many agents post telemetry, each waiting for its answer before the "
                        "next batch (default 50; the rest only poll and heartbeat)")
    p.add_argument("--inventory-share", type=float, default=0.1,
                   help="share of injected commands that are inventory.refresh, the rest node.health (default 0.1)")
    p.add_argument("--heartbeat", type=float, help="agents' heartbeat interval (default: the console's, 30 s)")
    p.add_argument("--poll-wait", type=float, help="agents' long-poll wait (default: the console's, 55 s)")
    p.add_argument("--console-env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for the console process, e.g. LOCKSTEP_DB_THREADS=16 (repeatable)")
    p.add_argument("--db-name", default="lockstep_bench", help="PostgreSQL database to create and drop "
                   "(and <name>_template; default lockstep_bench)")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432", metavar="URL",
                   help="PostgreSQL server, without a database name (default postgresql://postgres@127.0.0.1:5432)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379", metavar="URL",
                   help="Redis server, without a db index (default redis://127.0.0.1:6379)")
    p.add_argument("--redis-db", type=int, default=5, help="Redis db index to use and flush (default 5)")
    p.add_argument("--port", type=int, default=0, help="console port (default: a free one)")
    p.add_argument("--ramp-timeout", type=float, default=600.0, metavar="S",
                   help="give up on a level when the console does not hold every agent's poll after S seconds "
                        "(default 600): past its capacity, enrollment stalls")
    p.add_argument("--profile", action="store_true",
                   help="record the console with py-spy during the hold phase (console-profile.txt, collapsed stacks)")
    p.add_argument("--out", metavar="DIR", help="where logs and results go (default: a new directory in /tmp)")
    return p


def raise_open_files_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def machine() -> str:
    cpus = len(__import__("os").sched_getaffinity(0))
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    os_name = "?"
    with contextlib.suppress(FileNotFoundError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    return f"{cpus} cores, {mem:.0f} GiB, {os_name}, Python {platform.python_version()}, Linux {platform.release()}"


def table(results: list[dict]) -> str:
    rows = ["| agents | phase | polls held (min/mean) | conns (mean) | p50 / p99 / max delivery | delivered | "
            "telemetry rows/s | errors | console CPU | pg CPU | fleet CPU | machine |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for phase in ("hold", "ingest"):
            m = r.get(phase)
            if not m:
                continue
            c, d, cpu = m["console"], m["delivery"], m["cpu"]
            polls = c.get("polls_in_flight", {})
            conns = c.get("connections", {})
            fp = d["from_post"]
            errors = sum(m["fleet_errors_in_window"].values())
            bad_api = d["injected"] - d["api_status"].get("201", 0)
            rows.append(
                f"| {r['agents']} | {phase} | {polls.get('min')} / {polls.get('mean')} | {conns.get('mean')} | "
                f"{fp.get('p50_ms')} / {fp.get('p99_ms')} / {fp.get('max_ms')} ms | "
                f"{d['delivered']}/{d['injected']} | {m['telemetry_rows_per_s']} | "
                f"{errors} agent + {bad_api} API | {cpu['console_cores']} | {cpu['postgres_cores']} | "
                f"{cpu['fleet_cores']} | {cpu['machine_busy_pct']}% |")
    return "\n".join(rows)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        levels = [int(x) for x in args.agents.split(",") if x.strip()]
    except ValueError:
        print(f"error: --agents {args.agents!r}: give numbers separated by commas", file=sys.stderr)
        return 2
    limit = raise_open_files_limit()
    if limit < 2 * max(levels) + 1024:
        print(f"error: open files limit {limit} is too low for {max(levels)} agents (raise it: ulimit -n)",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="lockstep-bench-longpoll-"))
    out.mkdir(parents=True, exist_ok=True)

    def log(text: str) -> None:
        print(text, flush=True)

    base = Options(
        agents=levels[0], rate=args.rate, duration=args.duration, warmup=args.warmup,
        telemetry_every=None if args.telemetry_every < 0 else args.telemetry_every, records=args.records,
        ingest_duration=args.ingest_duration, ingest_every=args.ingest_every, ingest_records=args.ingest_records,
        ingest_agents=args.ingest_agents, inventory_share=args.inventory_share, heartbeat=args.heartbeat,
        poll_wait=args.poll_wait, db_name=args.db_name, pg=args.pg.rstrip("/"), redis_url=args.redis.rstrip("/"),
        redis_db=args.redis_db, port=args.port, console_env=dict(args.console_env), profile=args.profile,
        ramp_timeout=args.ramp_timeout,
        out=out, log=log,
    )
    # SIGTERM: unwind like Ctrl-C so every child is stopped and the databases dropped.
    signal.signal(signal.SIGTERM, _terminate)
    log(f"bench.longpoll: {machine()}; output in {out}")
    results = []
    template = None
    started = time.time()
    try:
        template = prepare_template(base, console_env(base))
        for n in levels:
            level_out = out / f"agents-{n}"
            level_out.mkdir(exist_ok=True)
            opts = replace(base, agents=n, out=level_out)
            log(f"level {n} agents:")
            level = Level(opts, template)
            try:
                result = asyncio.run(level.run())
            except RuntimeError as exc:
                log(f"  level {n} failed: {exc}")
                result = {**level.result, "failed": str(exc)}
            except KeyboardInterrupt:
                results.append({**level.result, "failed": "interrupted"})
                raise
            results.append(result)
            (level_out / "result.json").write_text(json.dumps(result, indent=2))
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        return 130
    finally:
        with signals_ignored():
            if template:
                with contextlib.suppress(Exception):
                    drop_database(base, template)
            with contextlib.suppress(Exception):
                flush_redis(base)
        summary = {"date": time.strftime("%Y-%m-%d", time.gmtime(started)), "machine": machine(),
                   "command": " ".join(["python -m bench.longpoll", *(argv if argv is not None else sys.argv[1:])]),
                   "results": results}
        (out / "results.json").write_text(json.dumps(summary, indent=2))
    ok = [r for r in results if "failed" not in r]
    if ok:
        log("\n" + table(ok))
    log(f"\nfull results: {out / 'results.json'}")
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
