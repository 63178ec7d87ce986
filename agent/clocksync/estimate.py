"""``python -m agent.clocksync.estimate TRACE.json``: print the lockstep.clockestimate/v1 of a trace.

Exit status: 0 estimated; 2 the document is invalid (the message names the field, the probe
index and the value); 3 valid but not estimable (one direction only, too few packets);
1 the file cannot be read or is not JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from agent.clocksync.fit import EstimateError, EstimatorConfig, estimate
from agent.clocksync.trace import TraceError, parse_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.clocksync.estimate",
                                     description="Offset and drift of B − A from a lockstep.clocktrace/v1.")
    parser.add_argument("trace", help="the lockstep.clocktrace/v1 JSON file ('-' for standard input)")
    parser.add_argument("--margin-only", action="store_true",
                        help="stop at the max-margin LP (no mixture refinement)")
    parser.add_argument("--details", action="store_true", help="add the estimator's diagnostics")
    args = parser.parse_args(argv)
    try:
        if args.trace == "-":
            text = sys.stdin.read()
        else:
            with open(args.trace, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        print(f"error: cannot read {args.trace}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        doc = json.loads(text)
    except ValueError as exc:
        print(f"error: {args.trace} is not JSON: {exc}", file=sys.stderr)
        return 1
    try:
        trace = parse_trace(doc)
    except TraceError as exc:
        print(f"error: invalid lockstep.clocktrace/v1: {exc}", file=sys.stderr)
        return 2
    try:
        result = estimate(trace, EstimatorConfig(refine=not args.margin_only))
    except EstimateError as exc:
        print(f"error: cannot estimate from {args.trace}: {exc}", file=sys.stderr)
        return 3
    out = result.to_document()
    if args.details:
        out["method"] = result.method
        out["details"] = result.details
    json.dump(out, sys.stdout, default=float)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
