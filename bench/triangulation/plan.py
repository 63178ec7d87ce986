"""Probe plan sizes on the 1,024- and 9,216-GPU fabrics.

    python -m bench.triangulation plan [--presets gpu1024,gpu9216,gpu9216-2tier] [--cross-leaf 8]

Per preset: peers per NIC (same leaf, same host, cross-leaf sample, repair), probes per second
per NIC and for the cluster at one probe per peer every 10 ms, the smallest coverage of every
element kind, and the time to compute the plan.
"""

from __future__ import annotations

import time

from testbed.simulate.topology import PRESETS, generate_topology
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology
from workers.probeplan import coverage_report, plan_probes

PROBE_HZ = 100


def main(args) -> int:
    print("| fabric | NICs | peers per NIC (same leaf + same host + cross-leaf) | probes/s per NIC | "
          "probes/s cluster | full mesh per NIC | min coverage link dir / switch | plan time |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.presets.split(","):
        topo = parse_topology(generate_topology(PRESETS[name][0]))
        index = PathIndex(topo)
        t0 = time.perf_counter()
        plan = plan_probes(index, seed=0, cross_leaf=args.cross_leaf)
        dt = time.perf_counter() - t0
        s = plan.sizes()
        nic = topo.nics[0].name
        leaf = {link.a: link.b for link in topo.links if topo.is_nic(link.a)}
        same_leaf = sum(1 for d in plan.peers[nic] if leaf.get(d) == leaf[nic])
        same_host = sum(1 for d in plan.peers[nic] if d.split("/")[0] == nic.split("/")[0])
        cov = coverage_report(index, plan)
        n = len(topo.nics)
        print(f"| {name} | {n:,} | {s['mean']:.0f} ({same_leaf} + {same_host} + "
              f"{s['mean'] - same_leaf - same_host:.0f}; min {s['min']}, max {s['max']}) | "
              f"{s['mean'] * PROBE_HZ:,.0f} | {s['total_pairs'] * PROBE_HZ:,.0f} | {n - 1:,} | "
              f"{cov['link_direction_min']:.1f} / {cov['switch_min']:.0f} | {dt:.1f} s |", flush=True)
    return 0
