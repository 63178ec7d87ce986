"""The ``lockstep`` command.

    lockstep run [--job NAME] [--spares N] [--snapshot-every 5m] [--scheduler local|slurm|kubernetes] -- torchrun [ARGS] SCRIPT [ARGS]
    lockstep jobs [--json]
    lockstep migrate --job NAME --rank R
    lockstep snapshot --job NAME / lockstep restore --job NAME --snapshot ID -- torchrun ...

Subcommands live in a registry: ``@subcommand(name, help)`` on a function ``(args) -> int`` whose
``configure`` attribute adds its arguments. Other parts of the package add theirs (``snapshot``,
``restore``) from the modules in ``PLUGIN_MODULES``, imported when present.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

SUBCOMMANDS: dict[str, tuple] = {}
PLUGIN_MODULES = ("lockstep.capture.cli",)


def subcommand(name: str, help: str, configure=None):
    def deco(fn):
        SUBCOMMANDS[name] = (help, configure or (lambda p: None), fn)
        return fn

    return deco


# -- talking to a job's orchestrator --------------------------------------------------------


class JobUnreachable(RuntimeError):
    pass


def call_job(job: str, msg: dict, timeout: float | None = 30.0) -> dict:
    from lockstep.orchestrator import jobdir

    path = os.path.join(jobdir.job_dir(job), "control.sock")
    if not os.path.exists(path):
        raise JobUnreachable(f"no running job named {job!r} (no {path})")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            raise JobUnreachable(f"job {job!r} does not answer ({exc}); it may have ended") from None
        sock.sendall(json.dumps(msg).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        raise JobUnreachable(f"job {job!r} closed the connection without answering")
    return json.loads(data)


def duration(text: str) -> float:
    """``90``, ``30s``, ``5m``, ``1h`` -> seconds (argparse type)."""
    units = {"s": 1, "m": 60, "h": 3600}
    num, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration like 30s, 5m or 1h") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than zero")
    return value


# -- run ------------------------------------------------------------------------------------


def _configure_run(p: argparse.ArgumentParser):
    p.add_argument("--job", help="job name (default: torchrun's --rdzv-id, else SCRIPT-TIMESTAMP)")
    p.add_argument("--spares", type=int, default=1,
                   help="replacements this node can start (default 1): each covers one lost rank; beyond one "
                        "per rank of the node, spares shadow ranks (a lost rank resumes from its shadow at once)")
    p.add_argument("--scheduler", default="local", help="where spares come from: local, slurm, kubernetes")
    p.add_argument("--snapshot-every", type=duration, default=None, metavar="DURATION",
                   help="snapshot the job's state periodically (e.g. 30s, 5m, 1h); see lockstep snapshot")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- torchrun [torchrun options] SCRIPT [ARGS]")


@subcommand("run", "run a torchrun command line with its ranks protected", _configure_run)
def cmd_run(args) -> int:
    from lockstep.orchestrator import jobdir, launchspec, node
    from lockstep.schedulers import names

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        spec = launchspec.parse(command)
    except launchspec.LaunchError as exc:
        print(f"lockstep run: {exc}", file=sys.stderr)
        return 2
    if args.spares < 0:
        print(f"lockstep run: --spares {args.spares}: must be 0 or more", file=sys.stderr)
        return 2
    if args.scheduler not in names():
        print(f"lockstep run: --scheduler {args.scheduler!r}: choose one of {', '.join(names())}", file=sys.stderr)
        return 2
    if args.snapshot_every is not None:
        os.environ["LOCKSTEP_SNAPSHOT_EVERY_S"] = str(args.snapshot_every)  # read by the orchestrator
    job = args.job or spec.rdzv_id or f"{os.path.splitext(os.path.basename(spec.script))[0]}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        jobdir.check_name(job)
    except ValueError as exc:
        print(f"lockstep run: --job: {exc}", file=sys.stderr)
        return 2
    if spec.node_rank in (0, None):
        info = jobdir.read_json(os.path.join(jobdir.job_dir(job), "job.json"))
        if info and jobdir.pid_alive(int(info.get("pid", 0))):
            print(f"lockstep run: a job named {job!r} is already running (orchestrator pid {info['pid']}); "
                  "choose another --job", file=sys.stderr)
            return 2
    return node.run(spec, job=job, spares=args.spares, scheduler=args.scheduler)


# -- jobs -------------------------------------------------------------------------------------


def _configure_jobs(p):
    p.add_argument("--json", action="store_true", help="machine-readable output")


@subcommand("jobs", "list the jobs running here, with their ranks, step, state and spares", _configure_jobs)
def cmd_jobs(args) -> int:
    from lockstep.orchestrator import jobdir

    out = []
    for name, info in jobdir.list_jobs():
        if not jobdir.pid_alive(int(info.get("pid", 0))):
            continue
        try:
            reply = call_job(name, {"op": "status"}, timeout=5)
        except (JobUnreachable, OSError, ValueError):
            continue
        if reply.get("ok"):
            out.append(reply["status"])
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    if not out:
        print("no Lockstep jobs are running")
        return 0
    for st in out:
        steps = [r["step"] for r in st["ranks"]]
        states = {}
        for r in st["ranks"]:
            states[r["status"]] = states.get(r["status"], 0) + 1
        print(f"{st['job']}: {st['world_size']} ranks on {st['nnodes']} node(s), step {min(steps)}-{max(steps)}, "
              f"generation {st['generation']}, spares {st['spares']} left ({st['spares_used']} used), "
              f"scheduler {st['scheduler']}" + (f", {st['busy']} under way" if st.get("busy") else ""))
        for problem in st.get("problems", []):
            print(f"  not protected: {problem}")
        shadows = {s["rank"]: s["step"] for s in st.get("shadows", [])}
        print(f"  {'rank':>4}  {'node':>4}  {'state':<10} {'step':>8}  {'step time':>9}  {'shadow at':>9}")
        for r in st["ranks"]:
            ms = f"{r['step_time_s'] * 1000:.1f} ms" if r["step_time_s"] else "-"
            node = "-" if r["node"] is None else r["node"]
            print(f"  {r['rank']:>4}  {node:>4}  {r['status']:<10} {r['step']:>8}  {ms:>9}  {shadows.get(r['rank'], '-'):>9}")
    return 0


# -- migrate ----------------------------------------------------------------------------------


def _configure_migrate(p):
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)


@subcommand("migrate", "move a rank to a spare now (quiesce at a step, copy its state, resume)", _configure_migrate)
def cmd_migrate(args) -> int:
    try:
        reply = call_job(args.job, {"op": "migrate", "rank": args.rank}, timeout=None)
    except (JobUnreachable, ValueError) as exc:
        print(f"lockstep migrate: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"lockstep migrate: {reply.get('error')}", file=sys.stderr)
        return 1
    r = reply["result"]
    print(f"rank {r['rank']} migrated at step {r['boundary']} from node {r['from_node']} to node {r['to_node']} "
          f"in {r['duration_s']:.2f} s (training paused {r['paused_s']:.2f} s)")
    return 0


# -- entry point ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    import importlib

    for mod in PLUGIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name is None or not mod.startswith(exc.name):
                raise
    parser = argparse.ArgumentParser(prog="lockstep", description="Keep distributed training running through failures.")
    subs = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name, (help_text, configure, _fn) in SUBCOMMANDS.items():
        configure(subs.add_parser(name, help=help_text))
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.subcommand:
        parser.print_help()
        return 2
    return SUBCOMMANDS[args.subcommand][2](args)


if __name__ == "__main__":
    sys.exit(main())
