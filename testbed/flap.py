"""The supervised link flapper behind `Fabric.fault_link_flap` (one process per flapping link).

Loops until killed (by `heal`): both ends down for duty x period, both up for the rest, then
reprograms the routes of the two namespaces (the kernel drops routes whose only next hop went
down). Each transition is appended to the fault log as a ``flap-down``/``flap-up`` event.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from . import netops
from .fabric import Fabric


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.flap", description=__doc__)
    parser.add_argument("--base", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--fault", required=True)
    parser.add_argument("--link", required=True)
    parser.add_argument("--period", type=float, required=True)
    parser.add_argument("--duty", type=float, required=True)
    args = parser.parse_args(argv)
    fab = Fabric.attach(args.prefix, args.base)
    link = fab.link(args.link)
    log = Path(fab.state["fault_log"])
    down_s, up_s = args.period * args.duty, args.period * (1 - args.duty)
    next_t = time.monotonic()
    while True:
        for up, hold in ((False, down_s), (True, up_s)):
            for end in link.ends():
                netops.run(["ip", "-n", end.ns, "link", "set", "dev", end.ifname, "up" if up else "down"])
            if up:
                fab.reapply_routes(sorted({link.a.ns, link.b.ns}))
            with open(log, "a") as f:
                f.write(json.dumps({"event": "flap-up" if up else "flap-down", "id": args.fault,
                                    "link": args.link, "t": time.time()}) + "\n")
            next_t += hold
            time.sleep(max(0.0, next_t - time.monotonic()))


if __name__ == "__main__":
    raise SystemExit(main())
