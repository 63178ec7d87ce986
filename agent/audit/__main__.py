"""Run the audit's node checks or the load generator on this host, without a console.

    python -m agent.audit node [--sections gpu,pcie,affinity,nic,host] [--args JSON] [--sysfs-root DIR]
    python -m agent.audit load SPEC.json
    python -m agent.audit collective --args JSON

``node`` prints the ``lockstep.audit.node/v1`` report (``--args``: the ``audit.node`` command's
arguments as JSON, e.g. ``'{"mtu": 4200, "nics": [{"device": "enp25s0np0"}]}'``); ``load`` runs
the ``audit.load`` arguments in SPEC.json and prints its result. Exit status 0 when the run
completed (whatever its verdict: read ``status``), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys

from agent.audit import collective, loadgen, node
from agent.audit.commands import COLLECTIVE_ARGS, NODE_ARGS, checked_node_args
from agent.commands.registry import ArgError, validate_args
from agent.inventory.gpus import load_nvml
from agent.inventory.paths import HostPaths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.audit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("node", help="run node checks and print the report")
    p.add_argument("--sections", default=",".join(node.SECTIONS), help="comma-separated (default: all)")
    p.add_argument("--args", default="{}", help="the audit.node arguments as a JSON object")
    p.add_argument("--sysfs-root", help="read sysfs from DIR (a recorded tree) instead of /sys")
    p = sub.add_parser("load", help="run the load generator from a spec file and print its result")
    p.add_argument("spec", help="JSON file with the audit.load arguments")
    p = sub.add_parser("collective", help="run this node's ranks of the collective test and print the result")
    p.add_argument("--args", required=True, help="the audit.collective arguments as a JSON object")
    args = parser.parse_args(argv)
    if args.cmd == "load":
        return loadgen.main([args.spec])
    if args.cmd == "collective":
        try:
            checked = validate_args(COLLECTIVE_ARGS, json.loads(args.args))
            print(json.dumps(collective.run(checked)))
        except (ValueError, ArgError) as exc:
            print(f"python -m agent.audit collective: {exc}", file=sys.stderr)
            return 2
        return 0
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    try:
        checked = checked_node_args(sections, validate_args(NODE_ARGS, json.loads(args.args)))
    except (ValueError, ArgError) as exc:
        print(f"python -m agent.audit node: {exc}", file=sys.stderr)
        return 2
    nvml, reason = load_nvml()
    report = node.run(sections, HostPaths.from_sysfs_root(args.sysfs_root), nvml, checked, nvml_reason=reason)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
