"""Incidents benchmarks (issue 10): ingest of probe windows, and detection latency on the
emulated fabric.

    python -m bench.incidents ingest [--windows 20] [--rate 1]          # anywhere
    python -m bench.incidents detect [--injections 20]                  # root, network namespaces

Both use PostgreSQL when DATABASE_URL is set (and Redis with a Celery worker when REDIS_URL
is), otherwise a fresh SQLite file in a temporary directory, migrated first. Results
are printed as JSON (`--json FILE` writes them); bench/incidents/README.md has the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from pathlib import Path


def setup_django(tmp: Path, debug: bool = True) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["SQLITE_PATH"] = str(tmp / "bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    if debug:
        os.environ.setdefault("DEBUG", "true")  # a throwaway console: its dev secret key, as the demo's
    elif not os.environ.get("SECRET_KEY"):
        # as deployed (DEBUG off: no SQL kept per query), with a throwaway key for this run only
        os.environ["DEBUG"] = "false"
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", "--noinput", verbosity=0)


def machine() -> dict:
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(), "load1": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "database": "postgresql" if os.environ.get("DATABASE_URL") else "sqlite"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.incidents", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="bench", required=True)
    ingest = sub.add_parser("ingest", help="probe windows per second stored and triangulated")
    ingest.add_argument("--windows", type=int, default=20, help="measured windows (after one warm-up window)")
    ingest.add_argument("--rate", type=float, default=1.0, help="windows offered per second (0: back to back)")
    ingest.add_argument("--preset", default="gpu1024")
    ingest.add_argument("--peers", type=int, default=46, help="peers per NIC (the plan's size at 1,024 GPUs)")
    detect = sub.add_parser("detect", help="fault injected -> incident on a browser's websocket")
    detect.add_argument("--injections", type=int, default=20, help="per fault kind")
    detect.add_argument("--faults", default="link-down,loss-5", help="link-down, loss-5 (5%% random loss)")
    detect.add_argument("--window-ms", type=int, help="the plan's window (default 1000)")
    detect.add_argument("--deadline-floor-ms", type=float, help="the plan's probe deadline floor (default 300)")
    for p in (ingest, detect):
        p.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-incidents-") as tmp:
        setup_django(Path(tmp), debug=args.bench != "ingest")
        if args.bench == "ingest":
            from bench.incidents.ingest import run

            result = run(windows=args.windows, preset=args.preset, peers=args.peers, rate=args.rate, tmp=Path(tmp),
                         log=lambda m: print(m, file=sys.stderr))
        else:
            from bench.incidents.detect import run

            options = {k: v for k, v in (("window_ms", args.window_ms), ("deadline_floor_ms", args.deadline_floor_ms))
                       if v is not None}
            result = run(injections=args.injections, faults=args.faults.split(","), tmp=Path(tmp),
                         log=lambda m: print(m, file=sys.stderr, flush=True), options=options)
    result = {"machine": machine(), **result}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
