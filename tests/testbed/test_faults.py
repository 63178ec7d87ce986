"""Each fault has the measured effect it claims, is logged as ground truth, and heals completely."""

from __future__ import annotations

import subprocess
import time

import pytest

from testbed import TestbedError, procs
from testbed.testing import PY, finish, probe, start_server, stop, tcp_throughput, tx, wait_for

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def fab(small_fabric):
    servers = [start_server(small_fabric, h, ["serve", "--port", "7000"]) for h in small_fabric.hosts]
    yield small_fabric
    for s in servers:
        stop(s)


@pytest.fixture(autouse=True)
def healthy_after(fab):
    """Every test leaves the fabric healed, and checks that healing really restored it."""
    yield
    fab.heal_all()
    for src, dst in (("node0000/nic0", "node0002/nic0"), ("node0001/nic1", "node0003/nic1")):
        result = wait_for(lambda s=src, d=dst: (r := probe(fab, s, d, count=40, flows=40))["lost"] == 0 and r,
                          timeout=10, what=f"{src} -> {dst} healthy after healing")
        assert result["flows_answered"] == 40
    assert fab.active_faults() == []


def one_way(fab, src, dst, count, port=7100):
    """Datagrams that arrive, measured by a sink at the destination NIC (no echo)."""
    host = fab.topology.nic(dst).host
    sink = start_server(fab, host, ["sink", "--bind", fab.nic_address(dst), "--port", str(port),
                                    "--quiet", "0.5", "--max-time", "20"])
    try:
        probe(fab, src, dst, count=count, flows=20, echo=False, port=port, interval=0.0003)
        return finish(sink)["received"]
    finally:
        if sink.poll() is None:
            stop(sink)


def events_of(fab, fid):
    return [e["event"] for e in fab.fault_log() if e.get("id") == fid]


def test_link_loss_drops_the_configured_rate_in_one_direction_only(fab):
    link = "node0000/nic0~leaf-su00-r0"  # a = the NIC, so 'a>b' is traffic leaving node0000/nic0
    fid = fab.fault_link_loss(link, rate=0.2, direction="a>b")
    truth = fab.ground_truth()
    assert truth["network_ok"] is False
    assert truth["culprits"] == [{"kind": "nic", "name": "node0000/nic0", "confidence": 1.0}]
    n = 2000
    received = one_way(fab, "node0000/nic0", "node0002/nic0", n)
    assert abs((n - received) / n - 0.2) < 0.045, received  # 5 standard deviations of Binomial(2000, 0.2)
    assert abs(fab.fault_stats(fid)["dropped_packets"] - (n - received)) <= 5
    assert one_way(fab, "node0002/nic0", "node0000/nic0", n, port=7101) >= n - 5  # the other way is clean
    fab.heal(fid)
    assert one_way(fab, "node0000/nic0", "node0002/nic0", 500, port=7102) >= 498
    assert events_of(fab, fid) == ["start", "end"]


def test_loss_on_one_uplink_hits_only_the_flows_hashed_through_it(fab):
    link = "leaf-su00-r0~spine-p0-00#0"
    fid = fab.fault_link_loss(link, rate=0.5, direction="leaf-su00-r0")  # leaf -> spine only
    assert fab.ground_truth()["culprits"][0] == {"kind": "link", "name": link, "confidence": 1.0}
    result = probe(fab, "node0000/nic0", "node0002/nic0", count=1000, flows=100)
    lossy = [(sent, got) for _, sent, got in result["per_flow"] if got < sent]
    assert 20 <= len(lossy) <= 80, len(lossy)  # about half the flows go up through spine 0
    loss = 1 - sum(g for _, g in lossy) / sum(s for s, _ in lossy)
    assert 0.4 < loss < 0.6, loss
    fab.heal(fid)


def test_link_down_stops_its_traffic_and_ecmp_routes_around_it(fab):
    link = "leaf-su01-r0~spine-p0-00#0"
    fid = fab.fault_link_down(link)
    c = fab.link_counters(link)
    assert not c["a"]["admin_up"] and not c["b"]["admin_up"]
    before = tx(fab, link)
    result = probe(fab, "node0000/nic0", "node0002/nic0", count=400, flows=200)
    assert result["lost"] == 0  # every flow goes through spine 1 now
    assert tx(fab, link) == before  # and nothing crossed the dead link
    assert fab.ground_truth()["culprits"][0]["name"] == link
    fab.heal(fid)
    wait_for(lambda: fab.link_counters(link)["a"]["carrier"], 5, "carrier back")
    before = tx(fab, link)
    assert probe(fab, "node0000/nic0", "node0002/nic0", count=200, flows=200)["lost"] == 0
    after = tx(fab, link)
    assert after["b"] - before["b"] > 30 and after["a"] - before["a"] > 30  # used again, both ways


def test_link_down_without_reroute_black_holes_the_far_side(fab):
    fid = fab.fault_link_down("leaf-su01-r0~spine-p0-00#0", reroute=False)
    result = probe(fab, "node0000/nic0", "node0002/nic0", count=200, flows=200, timeout=0.3)
    assert 30 < result["lost"] < 170, result["lost"]  # flows hashed to spine 0 die there
    fab.heal(fid)


def test_access_link_down_isolates_that_nic_only(fab):
    link = "node0001/nic1~leaf-su00-r1"
    fid = fab.fault_link_down(link)
    assert fab.ground_truth()["culprits"] == [{"kind": "nic", "name": "node0001/nic1", "confidence": 1.0}]
    assert probe(fab, "node0000/nic1", "node0001/nic1", count=20, flows=20, timeout=0.3)["received"] == 0
    assert probe(fab, "node0000/nic0", "node0001/nic0", count=20, flows=20)["lost"] == 0
    fab.heal(fid)
    wait_for(lambda: probe(fab, "node0000/nic1", "node0001/nic1", count=20, flows=20)["lost"] == 0, 10,
             "node0001/nic1 reachable again")


def test_link_flap_toggles_until_healed(fab):
    link = "leaf-su00-r1~spine-p0-01#0"
    fid = fab.fault_link_flap(link, period=0.4, duty=0.5)
    flapper = fab.refresh().state["faults"][fid]["apply"]["flapper"]
    assert procs.alive(flapper["pid"], flapper["start"])
    assert [f["flapper_alive"] for f in fab.active_faults()] == [True]
    seen = set()
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        seen.add(fab.link_counters(link)["a"]["admin_up"])
        time.sleep(0.03)
    assert seen == {True, False}
    wait_for(lambda: {"flap-down", "flap-up"} <= set(events_of(fab, fid)), 5, "flap events in the log")
    fab.heal(fid)
    assert not procs.alive(flapper["pid"], flapper["start"])
    for _ in range(10):  # stays up
        c = fab.link_counters(link)
        assert c["a"]["admin_up"] and c["b"]["admin_up"]
        time.sleep(0.05)
    before = tx(fab, link)
    assert probe(fab, "node0000/nic1", "node0002/nic1", count=200, flows=200)["lost"] == 0
    assert tx(fab, link)["a"] - before["a"] > 30  # routes through it are back


def test_rate_limit_caps_throughput_near_the_configured_rate(fab):
    baseline = tcp_throughput(fab, "node0000/nic0", "node0001/nic0", seconds=1.0)
    assert baseline > 200, baseline
    fid = fab.fault_link_rate("node0001/nic0~leaf-su00-r0", rate_mbit=20, direction="both")
    limited = tcp_throughput(fab, "node0000/nic0", "node0001/nic0", seconds=2.0)
    assert 12 < limited < 22, limited
    # load adds queueing delay: echoes wait behind a full bucket
    fab.heal(fid)
    assert tcp_throughput(fab, "node0000/nic0", "node0001/nic0", seconds=1.0) > 200


def test_rate_limit_with_load_adds_queueing_delay(fab):
    fid = fab.fault_link_rate("node0001/nic0~leaf-su00-r0", rate_mbit=5, direction="b>a", latency_ms=100)
    idle = probe(fab, "node0000/nic0", "node0001/nic0", count=50, flows=5, interval=0.01)["rtt_us"]["p50"]
    sink = start_server(fab, "node0001", ["tcp-sink", "--bind", fab.nic_address("node0001/nic0"), "--port", "7003"])
    load = fab.spawn("node0000", [PY, "-m", "testbed.probe", "tcp-send", "--src", fab.nic_address("node0000/nic0"),
                                  "--dst", fab.nic_address("node0001/nic0"), "--port", "7003", "--seconds", "3"],
                     stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # let the queue fill
        loaded = probe(fab, "node0000/nic0", "node0001/nic0", count=50, flows=5, interval=0.01, timeout=1.0)
    finally:
        load.kill()
        load.wait()
        stop(sink)
    assert loaded["rtt_us"]["p50"] is not None and loaded["rtt_us"]["p50"] > idle + 10_000, (idle, loaded)
    fab.heal(fid)


def test_switch_loss_drops_everything_the_switch_forwards(fab):
    fid = fab.fault_switch_loss("leaf-su01-r0", rate=0.2)
    assert fab.ground_truth()["culprits"] == [{"kind": "switch", "name": "leaf-su01-r0", "confidence": 1.0}]
    result = probe(fab, "node0000/nic0", "node0002/nic0", count=2000, flows=50, timeout=0.5)
    # request and echo both leave the lossy leaf: 1 - 0.8^2 = 0.36
    assert abs(result["lost"] / 2000 - 0.36) < 0.055, result["lost"]
    assert probe(fab, "node0000/nic1", "node0002/nic1", count=200, flows=50)["lost"] == 0  # other rail
    fab.heal(fid)


def test_nic_down_silences_that_nic_only(fab):
    fid = fab.fault_nic_down("node0000/nic1")
    assert not fab.link_counters("node0000/nic1~leaf-su00-r1")["a"]["admin_up"]
    assert probe(fab, "node0000/nic1", "node0002/nic1", count=20, flows=20, timeout=0.3)["received"] == 0
    assert probe(fab, "node0002/nic1", "node0000/nic1", count=20, flows=20, timeout=0.3)["received"] == 0
    assert probe(fab, "node0000/nic0", "node0002/nic0", count=20, flows=20)["lost"] == 0
    assert fab.ground_truth()["culprits"] == [{"kind": "nic", "name": "node0000/nic1", "confidence": 1.0}]
    fab.heal(fid)
    wait_for(lambda: probe(fab, "node0000/nic1", "node0002/nic1", count=20, flows=20)["lost"] == 0, 10,
             "node0000/nic1 back")


def test_host_stall_freezes_everything_in_the_host_until_healed(fab, tmp_path):
    beat = tmp_path / "beat"
    heart = fab.spawn("node0003", [PY, "-c", (
        "import time,sys\nn=0\nwhile True:\n n+=1\n open(sys.argv[1],'w').write(str(n))\n time.sleep(0.02)"),
        str(beat)])
    outsider = subprocess.Popen(["ip", "netns", "exec", fab.ns("node0003"), "sleep", "60"])  # not in the cgroup
    try:
        wait_for(lambda: beat.exists() and beat.read_text(), 5, "heartbeat")
        fid = fab.fault_host_stall("node0003")
        assert fab.ground_truth() == {"format": "lockstep.verdict/v1", "network_ok": True,
                                      "culprits": [{"kind": "host", "name": "node0003", "confidence": 1.0}]}
        frozen_at = beat.read_text()
        assert probe(fab, "node0000/nic0", "node0003/nic0", count=30, flows=10, timeout=0.5)["received"] == 0
        assert beat.read_text() == frozen_at  # the heartbeat stood still all that time
        assert procs.state(outsider.pid) == "T"
        fab.heal(fid)
        wait_for(lambda: beat.read_text() != frozen_at, 5, "heartbeat resumes")
        assert probe(fab, "node0000/nic0", "node0003/nic0", count=30, flows=10)["lost"] == 0
        assert procs.state(outsider.pid) in ("S", "R")
    finally:
        heart.kill()
        outsider.kill()
        heart.wait()
        outsider.wait()


def test_bad_fault_requests_are_refused_and_change_nothing(fab):
    with pytest.raises(TestbedError, match="not a link"):
        fab.fault_link_loss("no-such-link", rate=0.1)
    with pytest.raises(TestbedError, match="loss rate"):
        fab.fault_link_loss("node0000/nic0~leaf-su00-r0", rate=1.5)
    with pytest.raises(TestbedError, match="loss rate"):
        fab.fault_link_loss("node0000/nic0~leaf-su00-r0")  # no rate
    with pytest.raises(TestbedError, match="direction"):
        fab.fault_link_loss("node0000/nic0~leaf-su00-r0", rate=0.1, direction="sideways")
    with pytest.raises(TestbedError, match="duty"):
        fab.fault_link_flap("node0000/nic0~leaf-su00-r0", period=1, duty=1.0)
    with pytest.raises(TestbedError, match="not a switch"):
        fab.fault_switch_loss("node0000", rate=0.1)
    with pytest.raises(TestbedError, match="not a host"):
        fab.fault_host_stall("spine-p0-00")
    with pytest.raises(TestbedError, match="no active fault"):
        fab.heal("f999")
    assert fab.active_faults() == []
    fid = fab.fault_link_down("leaf-su00-r0~spine-p0-01#0")
    with pytest.raises(TestbedError, match="already under fault"):
        fab.fault_link_flap("leaf-su00-r0~spine-p0-01#0")
    assert [f["id"] for f in fab.active_faults()] == [fid]
    fab.heal(fid)


def test_ground_truth_over_time_windows(fab):
    t0 = time.time()
    fid = fab.fault_link_loss("leaf-su00-r1~spine-p0-00#0", "both", 0.1)  # (link, direction, rate)
    time.sleep(0.05)
    t_mid = time.time()
    fab.heal(fid)
    t_after = time.time() + 0.01
    name = {"kind": "link", "name": "leaf-su00-r1~spine-p0-00#0", "confidence": 1.0}
    assert fab.ground_truth(at=t_mid)["culprits"] == [name]
    assert fab.ground_truth(at=t_after)["culprits"] == []
    assert fab.ground_truth(window=(t0, t_after))["culprits"] == [name]
    start, end = [e for e in fab.fault_log() if e.get("id") == fid]
    assert start["event"] == "start" and end["event"] == "end" and end["t"] >= start["t"]
    assert start["params"] == {"rate": 0.1, "direction": "both", "ends": ["leaf-su00-r1", "spine-p0-00"]}
