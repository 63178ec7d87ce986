"""`python -m testbed.fleet run ...`: a simulated fleet against a real console."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import signal
import sys

from .fleet import Fleet, FleetConfig

DESCRIPTION = """\
A simulated fleet: N lightweight node agents as coroutines in this one process, each speaking
the real agent protocol (docs/agent-protocol.md) over HTTP to a running console. Each agent
enrolls as its own node (hostname <prefix><index>, a stable machine-id per index, so a rerun
re-enrolls the same nodes), puts an inventory, heartbeats, long-polls for commands and answers
node.health and inventory.refresh with plausible results, and (with --telemetry-every) posts
telemetry batches with an increasing seq. Failed requests are retried with exponential backoff
and jitter; a 401 or 403 on its credential stops an agent, as the protocol asks.

Progress goes to stderr as one JSON line every --stats-every seconds; at the end a summary
(counters, request latencies, errors by '<request>:<status>') goes to stdout as JSON, and the full
report (also every command received, with its receive time, and each agent's counters) to
--report. Ctrl-C or SIGTERM stops the fleet cleanly.
"""

EPILOG = """\
examples:
  python -m testbed.fleet run --console http://127.0.0.1:8000 --token lse_... --agents 2000
  python -m testbed.fleet run --console http://127.0.0.1:8000 --token lse_... --agents 20 --cluster 3 \\
      --heartbeat 5 --telemetry-every 2 --records 50 --duration 60 --report fleet.json
  python -m testbed.fleet run --console http://127.0.0.1:8000 --state fleet-state.json --agents 2000
      (reuses the credentials and telemetry seq saved by an earlier run with the same --state)
"""


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be ≥ 0, got {text}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="python -m testbed.fleet", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=fmt)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run a simulated fleet against a console", description=DESCRIPTION,
                         epilog=EPILOG, formatter_class=fmt)
    run.add_argument("--console", required=True, metavar="URL", help="the console's base URL, e.g. http://127.0.0.1:8000")
    run.add_argument("--token", default="", metavar="lse_...",
                     help="an enrollment token of the cluster (needs max uses ≥ --agents, or unlimited); "
                          "optional when --state holds credentials for every agent")
    run.add_argument("--agents", type=_positive(int), required=True, metavar="N", help="how many agents (= nodes)")
    run.add_argument("--cluster", type=int, metavar="ID",
                     help="cluster id sent with enrollment (must be the token's cluster); default: not sent")
    run.add_argument("--prefix", default="sim", metavar="NAME",
                     help="hostname prefix: agents are <prefix>00000, <prefix>00001, ... (default: sim)")
    run.add_argument("--first-index", type=_positive(int), default=0, metavar="I",
                     help="index of the first agent, to split one fleet over several processes (default 0)")
    run.add_argument("--heartbeat", type=float, metavar="S",
                     help="heartbeat interval in seconds (default: heartbeat_interval_s from enrollment, 15)")
    run.add_argument("--poll-wait", type=float, metavar="S",
                     help="long-poll wait in seconds (default: poll_wait_s from enrollment, 25)")
    run.add_argument("--poll-max", type=int, default=10, metavar="K", help="commands asked for per poll (default 10)")
    run.add_argument("--telemetry-every", type=_positive(float), metavar="S",
                     help="post a telemetry batch every S seconds per agent; 0 = back to back (default: no telemetry)")
    run.add_argument("--records", type=_positive(int), default=10, metavar="R",
                     help="records per telemetry batch (default 10)")
    run.add_argument("--telemetry-agents", type=_positive(int), metavar="K",
                     help="only the first K agents post telemetry (default: all)")
    run.add_argument("--no-inventory", action="store_true", help="do not PUT an inventory after enrolling")
    run.add_argument("--gpus", type=_positive(int), default=8, help="GPUs per simulated node (default 8)")
    run.add_argument("--rails", type=_positive(int), default=2, help="rail NICs per simulated node (default 2)")
    run.add_argument("--command-time", type=_positive(float), default=0.0, metavar="S",
                     help="simulated run time of a command, ±50%% (default 0: answer at once)")
    run.add_argument("--enroll-concurrency", type=int, default=16, metavar="K",
                     help="enrollments in flight at once (the console serializes them per token; default 16)")
    run.add_argument("--timeout", type=float, default=30.0, metavar="S",
                     help="request timeout; a poll gets its wait on top (default 30)")
    run.add_argument("--duration", type=_positive(float), default=0.0, metavar="S",
                     help="stop after S seconds (default 0: run until Ctrl-C / SIGTERM)")
    run.add_argument("--stats-every", type=_positive(float), default=10.0, metavar="S",
                     help="print a progress line (JSON) to stderr every S seconds; 0 = never (default 10)")
    run.add_argument("--report", metavar="FILE", help="write the full report (JSON) to FILE at the end")
    run.add_argument("--state", metavar="FILE",
                     help="load enrolled agents' credentials and telemetry seq from FILE, save them back at the end")
    run.add_argument("--seed", type=int, default=0, help="random seed (jitter, simulated values; default 0)")
    return p


def raise_open_files_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def _main(config: FleetConfig, args) -> dict:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    fleet = Fleet(config)
    return await fleet.run(duration=args.duration or None, stop=stop, stats_every=args.stats_every or None,
                           out=sys.stderr)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    limit = raise_open_files_limit(args.agents * 2 + 256)
    if limit < args.agents + 64:
        print(f"error: {args.agents} agents need about {args.agents + 64} open files, the limit is {limit} "
              f"(raise it: ulimit -n)", file=sys.stderr)
        return 2
    try:
        config = FleetConfig(
            console=args.console, token=args.token, agents=args.agents, cluster_id=args.cluster, prefix=args.prefix,
            first_index=args.first_index, heartbeat_s=args.heartbeat, poll_wait_s=args.poll_wait,
            poll_max=args.poll_max, telemetry_every_s=args.telemetry_every, records=args.records,
            telemetry_agents=args.telemetry_agents, inventory_on_enroll=not args.no_inventory, gpus=args.gpus,
            rails=args.rails, command_time_s=args.command_time, enroll_concurrency=args.enroll_concurrency,
            request_timeout_s=args.timeout, state_file=args.state, seed=args.seed,
        )
        report = asyncio.run(_main(config, args))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh)
    summary = {k: v for k, v in report.items() if k not in ("receipts", "per_agent")}
    summary["commands_received"] = len(report["receipts"])
    print(json.dumps(summary, indent=2))
    return 0 if report["agents"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
