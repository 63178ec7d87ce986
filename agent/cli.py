"""``python -m agent`` / ``lockstep-agent``: enroll, run, inventory, version.

    lockstep-agent enroll --console URL --token-file FILE|- [--cluster ID] [--state-dir DIR]
                          [--hostname NAME] [--machine-id ID] [--config FILE]
    lockstep-agent run [--config FILE]
    lockstep-agent inventory [--sysfs-root DIR] [--config FILE]
    lockstep-agent version

Exit codes: see :mod:`agent.enroll` (0 ok, 2 usage/config, 3 console
unreachable, 4 token refused, 5 conflict, 6 other).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from agent import __version__
from agent import log as agentlog
from agent.config import (
    ConfigError,
    load,
    validate_console_url,
    validate_enroll_token,
    validate_hostname,
    validate_machine_id,
)
from agent.enroll import EXIT_OK, EXIT_OTHER, EXIT_USAGE, EnrollError, enroll, success_line
from agent.inventory import HostPaths, collect


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with a hint, like argparse, but say what to do
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lockstep-agent", description="Lockstep node agent.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("enroll", help="exchange an enrollment token for this node's credential")
    p.add_argument("--console", metavar="URL", help="console URL (default: LOCKSTEP_CONSOLE_URL)")
    p.add_argument("--token-file", metavar="FILE",
                   help="read the enrollment token from FILE ('-': standard input); default: LOCKSTEP_ENROLL_TOKEN")
    # Refused with a sentence: a token in the command line is readable by every user of the node.
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--cluster", metavar="ID", type=int, help="cluster the node must join")
    p.add_argument("--state-dir", metavar="DIR", help="where the credential is stored (default /var/lib/lockstep)")
    p.add_argument("--hostname", metavar="NAME", help="report this host name")
    p.add_argument("--machine-id", metavar="ID", help="report this machine id")
    p.add_argument("--config", metavar="FILE", help="KEY=VALUE config file (default /etc/lockstep/agent.env)")

    p = sub.add_parser("run", help="run the daemon")
    p.add_argument("--config", metavar="FILE", help="KEY=VALUE config file (default /etc/lockstep/agent.env)")

    p = sub.add_parser("inventory", help="print the lockstep.inventory/v1 document")
    p.add_argument("--sysfs-root", metavar="DIR", help="read sysfs from DIR (a recorded tree) instead of /sys")
    p.add_argument("--config", metavar="FILE", help="KEY=VALUE config file (default /etc/lockstep/agent.env)")

    sub.add_parser("version", help="print the agent version")
    return parser


def read_token_file(name: str) -> str:
    """The token: the first line of FILE, or of standard input for '-'."""
    try:
        if name == "-":
            line = sys.stdin.readline()
        else:
            with open(name, encoding="utf-8") as fh:
                line = fh.readline()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--token-file {name!r} cannot be read: {exc}") from None
    return line.strip()


def _cmd_enroll(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
        console = args.console or config.console_url
        if args.token is not None:
            raise ConfigError("--token is not accepted: a command line is readable by every user of this node "
                              "(/proc/*/cmdline). Pass the token with --token-file FILE, --token-file - "
                              "(standard input) or LOCKSTEP_ENROLL_TOKEN")
        token = read_token_file(args.token_file) if args.token_file else config.enroll_token
        if not console:
            raise ConfigError("enroll needs --console URL (or LOCKSTEP_CONSOLE_URL)")
        if not token:
            raise ConfigError("enroll needs an enrollment token: --token-file FILE, --token-file - (standard "
                              "input) or LOCKSTEP_ENROLL_TOKEN; copy it from the console")
        console = validate_console_url("--console" if args.console else "LOCKSTEP_CONSOLE_URL", console)
        token = validate_enroll_token("--token-file" if args.token_file else "LOCKSTEP_ENROLL_TOKEN", token)
        hostname = validate_hostname("--hostname", args.hostname) if args.hostname else config.hostname
        machine_id = validate_machine_id("--machine-id", args.machine_id) if args.machine_id else config.machine_id
        if args.cluster is not None and args.cluster < 1:
            raise ConfigError(f"--cluster={args.cluster!r} must be a positive integer")
        cluster = args.cluster if args.cluster is not None else config.cluster_id
        state_dir = Path(args.state_dir).absolute() if args.state_dir else config.state_dir
    except ConfigError as exc:
        print(f"lockstep-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cred, path = enroll(
            console, token, state_dir, cluster_id=cluster, hostname=hostname, machine_id=machine_id,
            paths=HostPaths.from_sysfs_root(config.sysfs_root),
        )
    except EnrollError as exc:
        print(f"lockstep-agent: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # anything unexpected still gets its exit code and a sentence
        print(f"lockstep-agent: enrollment failed unexpectedly: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return EXIT_OTHER
    print(success_line(cred, path))
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
    except ConfigError as exc:
        print(f"lockstep-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    agentlog.setup(config.log_level)
    from agent.daemon import Daemon

    try:
        daemon = Daemon(config)
    except ImportError as exc:
        print(f"lockstep-agent: a command module cannot be imported ({exc}); check LOCKSTEP_COMMAND_MODULES",
              file=sys.stderr)
        return EXIT_USAGE
    return daemon.run()


def _cmd_inventory(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
        if args.sysfs_root:
            if not Path(args.sysfs_root).is_dir():
                raise ConfigError(f"--sysfs-root={args.sysfs_root!r} is not a directory")
            config = replace(config, sysfs_root=Path(args.sysfs_root))
    except ConfigError as exc:
        print(f"lockstep-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    document = collect(
        HostPaths.from_sysfs_root(config.sysfs_root), hostname=config.hostname, machine_id=config.machine_id
    )
    try:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... inventory | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"lockstep-agent {__version__}")
        return EXIT_OK
    handler = {"enroll": _cmd_enroll, "run": _cmd_run, "inventory": _cmd_inventory}[args.command]
    return handler(args)
