"""The coded-probe prober between two hosts of an emulated fabric, each with its own virtual clock."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from agent.clocksync.clock import ClockSource
from agent.clocksync.fit import estimate
from agent.clocksync.trace import parse_trace
from testbed import Fabric, generate
from testbed.testing import wait_for

REPO = Path(__file__).resolve().parents[2]
# Stated bound for software timestamps on an idle emulated fabric (veth through a switch
# namespace) on a shared 2-core machine: scheduling delays enter as queueing, not as error.
OFFSET_BOUND_NS = 5_000
DRIFT_BOUND_PPM = 1.0


def real_instant(source: ClockSource, local_ns: int) -> int:
    """The CLOCK_REALTIME instant at which ``source`` reads ``local_ns``."""
    real = local_ns - source.offset_ns
    for _ in range(3):
        real = local_ns - (source.transform(real) - real)
    return real


@pytest.mark.netns
@pytest.mark.slow
def test_two_namespaces_yield_a_trace_whose_estimate_matches_the_injected_clocks(prefix, base_dir, tmp_path):
    fab = Fabric.up(generate(hosts=2, rails=1, hosts_per_leaf=2, spines=1), prefix=prefix, base_dir=base_dir)
    procs = []
    try:
        epoch = time.time_ns()
        clocks = {"node0000": ClockSource(offset_ns=-31_415_926, drift_ppm=-17.5, epoch_ns=epoch),
                  "node0001": ClockSource(offset_ns=27_182_818, drift_ppm=42.25, epoch_ns=epoch)}
        addr = {h: fab.nic_address(f"{h}/nic0") for h in clocks}
        for host, other in (("node0000", "node0001"), ("node0001", "node0000")):
            src = clocks[host]
            env = {**os.environ, "PYTHONPATH": str(REPO), "LOCKSTEP_TEST_CLOCK_OFFSET_NS": str(src.offset_ns),
                   "LOCKSTEP_TEST_CLOCK_DRIFT_PPM": str(src.drift_ppm), "LOCKSTEP_TEST_CLOCK_EPOCH_NS": str(epoch)}
            procs.append(fab.spawn(host, [sys.executable, "-m", "agent.clocksync.probe", "--name", host,
                                          "--bind", addr[host], "--peer", f"{other}={addr[other]}",
                                          "--rate", "200", "--duration", "5", "--out", str(tmp_path)], env=env))
        for p in procs:
            assert p.wait(timeout=60) == 0
        stats = json.loads((tmp_path / "node0000.stats.json").read_text())
        assert stats["mode"] == "software" and stats["tx_stamps"] > 0.95 * stats["sent"]
        for a, b in (("node0000", "node0001"), ("node0001", "node0000")):
            doc = wait_for(lambda a=a, b=b: (tmp_path / f"{a}~{b}.json").exists()
                           and json.loads((tmp_path / f"{a}~{b}.json").read_text()), 10, "the trace")
            trace = parse_trace(doc)
            assert trace.fwd.sum() > 300 and (~trace.fwd).sum() > 300
            est = estimate(trace)
            real = real_instant(clocks[a], trace.t_ref_ns)
            true_offset = clocks[a].true_offset_ns(clocks[b], real)
            true_drift = (clocks[b].drift_ppm - clocks[a].drift_ppm) / (1 + clocks[a].drift_ppm * 1e-6)
            assert abs(est.offset_ns - true_offset) < OFFSET_BOUND_NS, (est, true_offset)
            assert abs(est.drift_ppm - true_drift) < DRIFT_BOUND_PPM, (est.drift_ppm, true_drift)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        fab.down()
