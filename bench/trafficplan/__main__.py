"""Traffic plan size and cost at fabric scale, and the load generator's CPU per packet.

    python -m bench.trafficplan                    # presets example, gpu1024, gpu2048-3tier, gpu9216
    python -m bench.trafficplan --presets gpu1024 --loadgen-pps 4000 --json out.json

Plan: CPU seconds of `workers.trafficplan.plan_traffic` (default parameters: 16 flows per NIC at
most, 2 ports per pair, epsilon 1e-3), flows, rounds, the least expected flows on any directed
link, links below target. Load generator: one process sends `--loadgen-flows` paced UDP flows to
itself over loopback for `--loadgen-seconds` at `--loadgen-pps` packets per second in total and
receives them; CPU time (user + system) per 1,000 packets sent and received.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from testbed.simulate.topology import PRESETS, generate_topology
from workers.fabric.topology import parse_topology
from workers.trafficplan.plan import plan_traffic


def bench_plan(name: str) -> dict:
    topo = parse_topology(generate_topology(PRESETS[name][0]))
    t0 = time.process_time()
    plan = plan_traffic(topo)
    cpu = time.process_time() - t0
    return {"preset": name, "nics": len(topo.nics), "links": len(topo.links), "plan_cpu_s": round(cpu, 3),
            "flows": len(plan.flows), "rounds": len(plan.rounds),
            "flows_per_nic": max(max(v) for v in plan.flows_per_nic_count().values()),
            "min_expected_flows_per_directed_link": round(float(min(plan.expected_fwd.min(), plan.expected_rev.min())), 3),
            "below_target": len(plan.below_target()), "uncoverable": len(plan.uncoverable())}


def bench_loadgen(flows: int, pps: int, seconds: float, size: int) -> dict:
    from agent.audit.loadgen import run_load  # noqa: PLC0415

    rate = pps / flows * size * 8 / 1e6
    spec = {"run": 1, "start_at": time.time() + 0.5, "duration_s": seconds, "window_s": seconds, "grace_s": 0.5,
            "packet_bytes": size,
            "flows": [{"id": i, "src": "a", "src_addr": "127.0.0.1", "dst": "b", "dst_addr": "127.0.0.1",
                       "sport": 42000 + i, "dport": 47999, "rate_mbit": rate} for i in range(flows)],
            "listen": [{"nic": "b", "addr": "127.0.0.1", "port": 47999,
                        "flows": [{"id": i, "src": "a"} for i in range(flows)]}]}
    t0 = os.times()
    result = run_load(spec)
    t1 = os.times()
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    sent = sum(sum(t["sent"]) for t in result["tx"])
    received = sum(sum(r["received"]) for r in result["rx"])
    return {"flows": flows, "offered_pps": pps, "seconds": seconds, "sent": sent, "received": received,
            "skipped": sum(t["skipped"] for t in result["tx"]), "cpu_s": round(cpu, 3),
            "cpu_ms_per_1000_packets": round(cpu * 1000 / ((sent + received) / 1000), 3) if sent else None,
            "cpu_cores": round(cpu / (seconds + 1.0), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.trafficplan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="example,gpu1024,gpu2048-3tier,gpu9216")
    p.add_argument("--loadgen-flows", type=int, default=16)
    p.add_argument("--loadgen-pps", type=int, default=4000)
    p.add_argument("--loadgen-seconds", type=float, default=5.0)
    p.add_argument("--loadgen-bytes", type=int, default=1000)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "load": os.getloadavg(), "cpus": os.cpu_count(), "plans": []}
    for name in [n for n in args.presets.split(",") if n]:
        row = bench_plan(name)
        out["plans"].append(row)
        print(json.dumps(row))
    out["loadgen"] = bench_loadgen(args.loadgen_flows, args.loadgen_pps, args.loadgen_seconds, args.loadgen_bytes)
    print(json.dumps(out["loadgen"]))
    out["load_after"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
