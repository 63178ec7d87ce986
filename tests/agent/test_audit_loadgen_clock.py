"""The load generator starts at ``start_at`` in cluster time, by the agent's synchronized clock, and
says so when it cannot (real UDP on the loopback; the cluster clock is a reading that differs from
CLOCK_REALTIME by a known amount, as a clock-synced node's does)."""

from __future__ import annotations

import socket
import time

from agent.audit.loadgen import run_load


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spec(start_at: float, duration_s: float = 1.0) -> dict:
    sport, dport = _free_port(), _free_port()
    return {"run": 7, "start_at": start_at, "duration_s": duration_s, "window_s": 0.5, "grace_s": 0.3,
            "packet_bytes": 200,
            "flows": [{"id": 1, "src": "a/n0", "src_addr": "127.0.0.1", "dst": "b/n0", "dst_addr": "127.0.0.1",
                       "sport": sport, "dport": dport, "rate_mbit": 1.0}],
            "listen": [{"nic": "b/n0", "addr": "127.0.0.1", "port": dport, "flows": [{"id": 1, "src": "a/n0"}]}]}


def _clock(ahead_s: float, synced: bool = True):
    return lambda: {"cluster_time_ns": time.time_ns() + int(ahead_s * 1e9), "offset_ns": 0, "drift_ppm": 0.0,
                    "sigma_ns": 400, "synced": synced}


def test_a_synced_agent_starts_at_the_cluster_instant_and_stamps_in_cluster_time():
    # the cluster clock is 30 s ahead of this host's: an agent reading start_at as its own time
    # would wait 30 s; by its cluster clock it starts at once and every packet lands in the windows
    start_at = time.time() + 30.0
    result = run_load(_spec(start_at), clock=_clock(30.0))
    assert result["clock"]["basis"] == "lockstep" and abs(result["clock"]["offset_ns"] - 30e9) < 0.5e9
    assert result["started_late_s"] < 1.0
    [tx], [rx] = result["tx"], result["rx"]
    assert sum(tx["sent"]) > 0 and sum(rx["received"]) == sum(tx["sent"]) and rx["late"] == 0
    # one-way delays against the cluster clock: loopback, so well under a second (not 30 s)
    assert all(o is None or o["max"] < 1e6 for o in rx["owd_us"])


def test_lateness_is_measured_by_the_cluster_clock():
    # the cluster clock is 20 s behind: by it, start_at was 0.6 s ago (by this host's, 20.6 s)
    start_at = time.time() - 20.0 - 0.6
    result = run_load(_spec(start_at, duration_s=2.0), clock=_clock(-20.0))
    assert 0.5 <= result["started_late_s"] < 2.0
    assert sum(result["tx"][0]["sent"][:1]) == 0 and sum(result["tx"][0]["sent"][2:]) > 0  # sent from when it began


def test_an_agent_without_a_synchronized_clock_says_it_started_by_its_own():
    for clock, why in ((None, "no cluster clock"), (_clock(5.0, synced=False), "not synchronized"),
                       (lambda: None, "no clock sync runs")):
        result = run_load(_spec(time.time() + 0.2, duration_s=0.5), clock=clock)
        assert result["clock"]["basis"] == "realtime" and result["clock"]["offset_ns"] == 0
        assert why in result["clock"]["reason"] and "its own clock" in result["clock"]["reason"]
        assert result["started_late_s"] == 0 and sum(result["rx"][0]["received"]) > 0


def test_the_daemon_serves_command_handlers_cluster_time_only_from_a_clock_sync_provider(tmp_path):
    from agent_testlib import agent_config

    from agent.clusterclock import ClusterTime
    from agent.daemon import Daemon

    daemon = Daemon(agent_config(tmp_path / "state", None), nvml=None)
    assert daemon.clock_reading() is None  # no clock sync: the load starts by the local clock, and says so

    class Synced:
        def cluster_time(self):
            return ClusterTime(time.time_ns() + 7_000_000_000, 7_000_000_000, 0.0, 300, True)

    daemon.cluster_clock.provide(Synced())
    reading = daemon.clock_reading()
    assert reading["synced"] is True and reading["cluster_time_ns"] - time.time_ns() > 6e9
    result = run_load(_spec(time.time() + 7.2, duration_s=0.5), clock=daemon.clock_reading)
    assert result["clock"]["basis"] == "lockstep" and result["started_late_s"] == 0
