"""``python -m workers.clocksolve GRAPH.json``: print the lockstep.clocksolution/v1 of a graph.

Exit status: 0 solved; 2 the document is invalid (the message names the field and value);
1 the file cannot be read or is not JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from workers.clocksolve.graph import GraphError, parse_graph
from workers.clocksolve.solver import SolverConfig, solve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.clocksolve",
                                     description="Loop-consistent per-node clock offsets from a lockstep.clockgraph/v1.")
    parser.add_argument("graph", help="the lockstep.clockgraph/v1 JSON file ('-' for standard input)")
    parser.add_argument("--robust", choices=("tukey", "huber", "none"), default="tukey",
                        help="loss: tukey (default, flags bad edges), huber, or none (plain weighted least squares)")
    parser.add_argument("--flag-k", type=float, default=SolverConfig.flag_k,
                        help="flag an edge whose standardised residual exceeds this (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.graph == "-":
            text = sys.stdin.read()
        else:
            with open(args.graph, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        print(f"error: cannot read {args.graph}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        doc = json.loads(text)
    except ValueError as exc:
        print(f"error: {args.graph} is not JSON: {exc}", file=sys.stderr)
        return 1
    try:
        graph = parse_graph(doc)
    except GraphError as exc:
        print(f"error: invalid lockstep.clockgraph/v1: {exc}", file=sys.stderr)
        return 2
    solution = solve(graph, SolverConfig(robust=args.robust, flag_k=args.flag_k))
    json.dump(solution.to_document(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
