"""python -m workers.triangulation TOPOLOGY.json OBSERVATIONS.json

Prints the `lockstep.verdict/v1` JSON of the window on stdout and exits 0. An unreadable file, a
JSON syntax error (with its line and column) or an invalid document (every bad key, name and row
named) goes to stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workers.fabric.observations import ObservationsError, parse_observations
from workers.fabric.topology import TopologyError, parse_topology
from workers.triangulation import FabricModel, triangulate


def _load(path: str, what: str):
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SystemExit(f"error: {what} {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: {what} {path}: line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.triangulation", description=__doc__.split("\n\n")[1])
    ap.add_argument("topology", help="a lockstep.topology/v1 JSON file")
    ap.add_argument("observations", help="a lockstep.observations/v1 JSON file")
    ap.add_argument("--evidence", action="store_true", help="add each culprit's evidence to the verdict")
    args = ap.parse_args(argv)
    topo_doc = _load(args.topology, "topology")
    obs_doc = _load(args.observations, "observations")
    try:
        topology = parse_topology(topo_doc)
    except TopologyError as exc:
        print(f"error: topology {args.topology}: {exc}", file=sys.stderr)
        return 2
    model = FabricModel(topology)
    try:
        window = parse_observations(obs_doc, model.index)
    except ObservationsError as exc:
        print(f"error: observations {args.observations}: {exc}", file=sys.stderr)
        return 2
    for w in window.warnings:
        print(f"warning: observations {args.observations}: {w}", file=sys.stderr)
    verdict = triangulate(model, window)
    json.dump(verdict.to_document(evidence=args.evidence), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            sys.exit(2)
        raise
