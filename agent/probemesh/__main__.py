"""``python -m agent.probemesh run PLAN.json [--duration S] [--engine auto|native|python]``

Runs a probe.mesh plan outside the agent and prints each ``probe.window`` record as one JSON
line on stdout (and the engine's health as the last line, ``{"status": ...}``; with ``--routes``,
the paths learned before it, ``{"routes": [{"nic", "peer", "sport", "hops", "path"}]}``). The plan is the
activity's argument; it is checked the same way (exit status 2 and the named error when bad).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from agent.commands.registry import validate_args
from agent.probemesh import plan as planmod
from agent.probemesh.runner import EngineError, MeshRunner


class _FixedClock:
    """A cluster clock that says it is synchronized with offset 0 (for hosts that share one
    clock, as the testbed's namespaces do)."""

    def now(self):
        from agent.clusterclock import ClusterTime

        return ClusterTime(time.time_ns(), 0, 0.0, 0, True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.probemesh")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a plan and print its probe.window records")
    run.add_argument("plan", help="the plan (the probe.mesh activity's arguments) as a JSON file, or - for stdin")
    run.add_argument("--duration", type=float, default=None, help="seconds to run (default: until SIGTERM)")
    run.add_argument("--engine", choices=("auto", "native", "python"), default=None)
    run.add_argument("--synced-clock", action="store_true",
                     help="treat the local clock as the cluster clock (hosts sharing one clock)")
    run.add_argument("--routes", action="store_true",
                     help="print the paths learned, one flow each, before the last line")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.plan == "-" else Path(args.plan).read_text(encoding="utf-8")
        doc = json.loads(text)
        if args.engine:
            doc["engine"] = args.engine
        plan = planmod.check(validate_args(planmod.ARGS, doc))
    except (OSError, ValueError) as exc:  # ArgError is a ValueError: the plan's field is named
        print(f"probemesh: {exc}", file=sys.stderr)
        return 2
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))

    def emit(kind: str, data: dict) -> None:
        sys.stdout.write(json.dumps({"kind": kind, "data": data}, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    runner = MeshRunner(emit, _FixedClock() if args.synced_clock else None)
    end = time.monotonic() + args.duration if args.duration else None
    try:
        runner.apply(plan)
        while not stop[0] and (end is None or time.monotonic() < end):
            runner.step(0.1)
    except EngineError as exc:
        print(f"probemesh: {exc}", file=sys.stderr)
        return 1
    finally:
        status = runner.status()
        routes = runner.routes() if args.routes else None
        runner.close()
        with contextlib.suppress(BrokenPipeError):
            if routes is not None:
                sys.stdout.write(json.dumps({"routes": routes}) + "\n")
            sys.stdout.write(json.dumps({"status": status}) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
