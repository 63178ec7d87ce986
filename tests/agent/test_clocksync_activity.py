"""The clock.sync activity in a running agent, driven by activity.set from the (fake) console.

The agent (node-a, with a test-only virtual clock) probes one peer (node-b: a prober in this
process with another virtual clock, so the truth is known) over loopback; each window it sends
one clock.estimate record with the pair's offset and drift; a re-plan carrying a correction
makes the local socket's `time` answer cluster time, synced; a bad plan fails the command
naming the field; a stop hands `time` back to the local clock.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from agent_testlib import wait_for
from probemesh_testlib import free_udp_port, loopback_base

from agent.clocksync.clock import ClockSource
from agent.clocksync.probe import ClockProber
from agent.localsock.client import AgentSocket

# Software timestamps on loopback on a shared, loaded machine (the prober test's bound).
OFFSET_BOUND_NS = 5_000
DRIFT_BOUND_PPM = 1.0


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="ls-clk-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def finished(console, cid: str):
    command = console.command(cid)
    return command if command.state in ("succeeded", "failed") else None


def estimates(console, node: int) -> list[dict]:
    return [r["data"] for r in console.telemetry_records(node) if r["kind"] == "clock.estimate"]


def test_clock_sync_estimates_the_planned_peer_applies_the_correction_and_serves_cluster_time(
        console, start_daemon, short_dir, monkeypatch):
    epoch = time.time_ns()
    mine = ClockSource(offset_ns=-12_345_678, drift_ppm=-21.5, epoch_ns=epoch)
    theirs = ClockSource(offset_ns=31_415_926, drift_ppm=17.25, epoch_ns=epoch)
    monkeypatch.setenv("LOCKSTEP_TEST_CLOCK_OFFSET_NS", str(mine.offset_ns))
    monkeypatch.setenv("LOCKSTEP_TEST_CLOCK_DRIFT_PPM", repr(mine.drift_ppm))
    monkeypatch.setenv("LOCKSTEP_TEST_CLOCK_EPOCH_NS", str(epoch))
    base = loopback_base()
    addr_a, addr_b = f"{base}.1", f"{base}.2"
    port = free_udp_port(addr_a)
    sock_path = short_dir / "agent.sock"
    running = start_daemon(console, enroll_token=console.create_token(), agent_socket=str(sock_path))
    node = wait_for(lambda: running.daemon.cred and running.daemon.cred.node_id, 15, "enrollment")
    plan = {"name": "node-a", "address": addr_a, "port": port, "peers": [["node-b", addr_b]], "window_s": 1.0}
    with ClockProber("node-b", addr_b, port, {"node-a": (addr_a, port)}, source=theirs):
        cid = console.enqueue(node, "activity.set", {"name": "clock.sync", "args": plan, "revision": 1})
        assert wait_for(lambda: finished(console, cid), 20, "activity.set").status == "succeeded"
        wait_for(lambda: len([e for e in estimates(console, node) if e["pairs"]]) >= 3, 60, "clock.estimate windows")
        for record in [e for e in estimates(console, node) if e["pairs"]][1:]:
            assert record["node"] == "node-a" and record["timestamping"] == "software" and not record["synced"]
            (pair,) = record["pairs"]
            assert pair["peer"] == "node-b" and pair["probes_used"] > 0  # how many: the load decides
            t_ref = record["t_ref_ns"]  # on node-a's clock: the real instant it stands for
            real = t_ref - mine.offset_ns
            for _ in range(3):
                real = t_ref - (mine.transform(real) - real)
            true_offset = mine.true_offset_ns(theirs, real)
            assert abs(pair["offset_ns"] - true_offset) < OFFSET_BOUND_NS, (pair, true_offset)
            true_drift = (theirs.drift_ppm - mine.drift_ppm) / (1 + mine.drift_ppm * 1e-6)
            assert abs(pair["drift_ppm"] - true_drift) < DRIFT_BOUND_PPM
        client = AgentSocket(str(sock_path))
        assert client.time(timeout=2)["synced"] is False

        # the console's correction: node-a's clock − the reference's (here node-b's) = −(b − a)
        now_local = mine.now_ns()
        real_now = now_local - mine.offset_ns
        correction = {"offset_ns": -mine.true_offset_ns(theirs, real_now), "drift_ppm": mine.drift_ppm - theirs.drift_ppm,
                      "sigma_ns": 150.0, "t_ref_ns": now_local, "reference": "node-b"}
        cid = console.enqueue(node, "activity.set", {"name": "clock.sync", "args": {**plan, "correction": correction},
                                                     "revision": 2})
        assert wait_for(lambda: finished(console, cid), 20, "the re-plan").status == "succeeded"
        answer = wait_for(lambda: (a := client.time(timeout=2)) and a["synced"] and a, 10, "a synced time")
        real_at = time.time_ns()
        assert answer["sigma_ns"] == 150.0
        # cluster time is node-b's clock: within the bound plus the socket's round trip
        assert abs(answer["cluster_time_ns"] - theirs.transform(real_at)) < 5_000_000
        # offset_ns is cluster time − this node's clock: node-b's clock − node-a's
        assert abs(answer["offset_ns"] - mine.true_offset_ns(theirs, real_at)) < 1_000

        # a bad plan fails, naming the field; the running plan stays
        bad = {**plan, "peers": [["node-b", "127.0.0.300"]]}
        cid = console.enqueue(node, "activity.set", {"name": "clock.sync", "args": bad, "revision": 3})
        refused = wait_for(lambda: finished(console, cid), 20, "the refused plan")
        assert refused.status == "failed" and "peers[0][1]: '127.0.0.300' is not a unicast IPv4 address" in refused.error
        assert running.daemon.supervisor.state_of("clock.sync")["revision"] == 2

        cid = console.enqueue(node, "activity.set", {"name": "clock.sync", "state": "stopped", "revision": 4})
        assert wait_for(lambda: finished(console, cid), 20, "the stop").status == "succeeded"
        wait_for(lambda: client.time(timeout=2)["synced"] is False, 10, "time back on the local clock")
