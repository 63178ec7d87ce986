"""python -m bench.triangulation accuracy|speed|plan [options]: see bench/triangulation/README.md."""

from __future__ import annotations

import argparse
import sys

from bench.triangulation import accuracy, plan, speed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.triangulation")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("accuracy", help="precision, recall and F1 per fault kind, against two baselines")
    a.add_argument("--sim", type=int, default=4, help="testbed.simulate seeds per topology and fault set (0: skip)")
    a.add_argument("--gen2", type=int, default=300, help="gen2 scenarios (0: skip)")
    a.add_argument("--gen2-seed", type=int, default=0, help="first gen2 seed")
    a.add_argument("--out", default="var/bench-triangulation", help="directory for accuracy.md / accuracy.json")
    s = sub.add_parser("speed", help="localization time on the 1,024- and 9,216-GPU fabrics")
    s.add_argument("--presets", default="gpu1024,gpu9216,gpu9216-2tier")
    s.add_argument("--repeat", type=int, default=5)
    s.add_argument("--faults", default="link_loss:1,switch_loss:1,nic_loss:1")
    s.add_argument("--previous-faults", default="link_congestion:1,host_loss:1",
                   help="faults of the previous window a warm model has localized")
    p = sub.add_parser("plan", help="probe plan sizes per NIC on the 1,024- and 9,216-GPU fabrics")
    p.add_argument("--presets", default="gpu1024,gpu9216,gpu9216-2tier")
    p.add_argument("--cross-leaf", type=int, default=8)
    args = ap.parse_args(argv)
    return {"accuracy": accuracy.main, "speed": speed.main, "plan": plan.main}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
