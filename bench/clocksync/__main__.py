"""Clock-sync benchmarks.

    python -m bench.clocksync offline [--traces N] [--graphs N] [--json FILE]
    python -m bench.clocksync fabric  [--hosts N] [--duration S] [--json FILE]   (root: namespaces)
    python -m bench.clocksync wired   [--hosts N] [--duration S] [--json FILE]   (root: namespaces)

``offline``: the estimator and the solver against generated traces and graphs and the shared
examples, with the chrony-style regression and plain/Huber least squares beside them.
``fabric``: hosts in network namespaces with random virtual clocks probing each other with the
agent's prober, estimated and solved, against the truth and against chrony on the same fabric.
``wired``: the whole system — real agents, the console, corrections as commands — and the
cluster time each agent's local socket serves, against the truth.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clocksync")
    sub = parser.add_subparsers(dest="what", required=True)
    off = sub.add_parser("offline", help="estimator and solver on generated traces and graphs")
    off.add_argument("--traces", type=int, default=20, help="traces per profile")
    off.add_argument("--graphs", type=int, default=20, help="graphs per timestamp class")
    off.add_argument("--json", help="write the results here")
    fab = sub.add_parser("fabric", help="emulated fabric in namespaces, with chrony beside it (root)")
    fab.add_argument("--hosts", type=int, default=6)
    fab.add_argument("--duration", type=float, default=300.0, help="seconds per phase (idle, loaded)")
    fab.add_argument("--rate", type=float, default=200.0, help="coded probes per second per peer")
    fab.add_argument("--peers", type=int, default=4, help="peers per host")
    fab.add_argument("--seed", type=int, default=1)
    fab.add_argument("--phases", default="idle,loaded")
    fab.add_argument("--out", help="directory for traces, logs and results (default: a temporary one)")
    fab.add_argument("--json", help="write the results here")
    fab.add_argument("--keep-traces", action="store_true", help="keep every round's traces (analysis)")
    wired = sub.add_parser("wired", help="real agents and the console on an emulated fabric (root)")
    wired.add_argument("--hosts", type=int, default=6)
    wired.add_argument("--duration", type=float, default=120.0, help="seconds of sampling after the start")
    wired.add_argument("--settle", type=float, default=30.0, help="seconds left out of the error percentiles")
    wired.add_argument("--peers", type=int, default=4, help="peers per host")
    wired.add_argument("--correct-every", type=int, default=10, help="LOCKSTEP_CLOCK_CORRECT_EVERY_S")
    wired.add_argument("--seed", type=int, default=1)
    wired.add_argument("--out", help="directory for logs and results (default: a temporary one)")
    wired.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.what == "offline":
        from bench.clocksync.offline import main as offline
        return offline(args)
    if args.what == "wired":
        from bench.clocksync.wired import main as wired
        return wired(args)
    from bench.clocksync.fabric import main as fabric
    return fabric(args)


if __name__ == "__main__":
    sys.exit(main())
