"""``lockstep snapshot``, ``lockstep snapshots`` and ``lockstep restore`` (job snapshots through the
injected runtime; see ``lockstep.runtime.snapshot`` and ``lockstep.orchestrator.snapshots``).

    lockstep snapshot --job NAME                          capture every rank at one step now
    lockstep snapshots --job NAME [--json]                the job's published snapshots
    lockstep restore --job NAME --snapshot ID -- torchrun [ARGS] SCRIPT [ARGS]
"""

from __future__ import annotations

import json
import os
import sys

from lockstep.cli import JobUnreachable, _configure_run, call_job, cmd_run, subcommand


def _configure_snapshot(p):
    p.add_argument("--job", required=True)


@subcommand("snapshot", "capture a running job's state (every rank at one step) without stopping it", _configure_snapshot)
def cmd_snapshot(args) -> int:
    try:
        reply = call_job(args.job, {"op": "snapshot"}, timeout=None)
    except (JobUnreachable, ValueError) as exc:
        print(f"lockstep snapshot: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"lockstep snapshot: {reply.get('error')}", file=sys.stderr)
        return 1
    m = reply["result"]
    print(f"snapshot {m['id']} of job {m['job']} at step {m['step']}: {m['bytes']} bytes in {m['path']} "
          f"(training paused {m['paused_s']:.3f} s, {m['duration_s']:.2f} s in all)")
    for note in m["undiscovered"]:
        print(f"  not in the snapshot: {note}")
    return 0


def _configure_snapshots(p):
    p.add_argument("--job", required=True)
    p.add_argument("--json", action="store_true", help="machine-readable output")


@subcommand("snapshots", "list a job's published snapshots", _configure_snapshots)
def cmd_snapshots(args) -> int:
    from lockstep.orchestrator import jobdir
    from lockstep.orchestrator.snapshots import list_snapshots

    try:
        jobdir.check_name(args.job)
    except ValueError as exc:
        print(f"lockstep snapshots: --job: {exc}", file=sys.stderr)
        return 2
    found = list_snapshots(args.job)
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found:
        print(f"job {args.job} has no snapshots")
    for m in found:
        print(f"{m['id']}  step {m['step']:>8}  {m['bytes']:>12} bytes  {m['world_size']} ranks  {m['reason']}")
    return 0


def _configure_restore(p):
    p.add_argument("--snapshot", required=True, help="the snapshot's id (lockstep snapshots --job NAME)")
    _configure_run(p)


@subcommand("restore", "run a job again from one of its snapshots (the same torchrun command line)", _configure_restore)
def cmd_restore(args) -> int:
    from lockstep.orchestrator.snapshots import find

    if not args.job:
        print("lockstep restore: --job is required (the job the snapshot belongs to)", file=sys.stderr)
        return 2
    try:
        manifest = find(args.job, args.snapshot)
    except ValueError as exc:
        print(f"lockstep restore: --snapshot: {exc}", file=sys.stderr)
        return 2
    # Every rank of the new run reads its part from there (inherited through the environment).
    os.environ["LOCKSTEP_RESTORE"] = manifest["path"]
    return cmd_run(args)
