"""The audit's defects on the emulated fabric behave as described, measured with the audit's own
load generator (``python -m agent.audit load``) between namespaces:

- a rate-limited cable (``link-rate``, a degraded optic) passes an idle probe and caps a loaded
  flow's throughput at its rate (within 15%), with queueing delay;
- a policed cable (``link-police``) passes an idle probe and drops what a loaded flow sends above
  its rate, without the delay;
- one direction lossy (``link-loss --direction``) loses only that way under load;
- a NIC at the wrong MTU (``nic-mtu``) answers small probes and drops large packets;
- a switch with ECMP off (``switch-ecmp-off``) sends every flow up one uplink;
- a GPU defect (``node-gpu``) shows in the host's audit through the NVML fake;
- the traffic plan, assigned to every host and run at once, loads every link both ways, and its
  merged windows show loss exactly on the pairs crossing a policed NIC.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from testbed import TestbedError, nvmlshim
from testbed.testing import PY, probe, start_server, stop, tx, wait_for
from workers.trafficplan.assign import agent_args
from workers.trafficplan.plan import plan_traffic
from workers.trafficplan.windows import observations

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]
PAYLOAD = 1000
FRAME_OVERHEAD = 42  # UDP 8 + IPv4 20 + Ethernet 14: what tbf and the policer count beyond the payload


@pytest.fixture(scope="module")
def fab(small_fabric):
    servers = [start_server(small_fabric, h, ["serve", "--port", "7000"]) for h in small_fabric.hosts]
    yield small_fabric
    for s in servers:
        stop(s)


@pytest.fixture(autouse=True)
def healthy_after(fab):
    yield
    fab.heal_all()
    assert fab.active_faults() == []
    result = wait_for(lambda: (r := probe(fab, "node0000/nic0", "node0002/nic0", count=40, flows=40))["lost"] == 0
                      and r, timeout=10, what="node0000/nic0 -> node0002/nic0 healthy after healing")
    assert result["flows_answered"] == 40


_run = [int(time.time()) % 100000]


def next_run() -> int:
    _run[0] += 1
    return _run[0]


def load(fab, tmp_path: Path, specs: dict[str, dict], timeout: float = 60) -> dict[str, dict]:
    """Run `python -m agent.audit load` in each host at once; their results by host."""
    procs = {}
    for host, spec in specs.items():
        path = tmp_path / f"load-{host}-{spec['run']}.json"
        path.write_text(json.dumps(spec))
        procs[host] = fab.spawn(host, [PY, "-m", "agent.audit", "load", str(path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=os.environ | {"PYTHONPATH": str(REPO)}, cwd=str(REPO))
    out = {}
    for host, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr.decode()
        out[host] = json.loads(stdout)
    return out


def pair_specs(fab, pairs: list[tuple[str, str, int, float]], *, duration: float = 3.0, size: int = PAYLOAD,
               window_s: float = 1.0, run: int | None = None) -> dict[str, dict]:
    """Specs for flows (src NIC, dst NIC, count, Mbit/s each); every host starts 1.5 s from now."""
    run = run if run is not None else next_run()
    start = time.time() + 1.5
    base = {"run": run, "start_at": start, "duration_s": duration, "window_s": window_s, "packet_bytes": size,
            "grace_s": 1.0}
    specs: dict[str, dict] = {}
    fid = 0
    for src, dst, count, mbit in pairs:
        s_host, d_host = fab.topology.nic(src).host, fab.topology.nic(dst).host
        sspec = specs.setdefault(s_host, base | {"flows": [], "listen": []})
        dspec = specs.setdefault(d_host, base | {"flows": [], "listen": []})
        lis = next((x for x in dspec["listen"] if x["nic"] == dst), None)
        if lis is None:
            lis = {"nic": dst, "addr": fab.nic_address(dst), "device": fab.nic_ifname(dst), "port": 47000, "flows": []}
            dspec["listen"].append(lis)
        for _ in range(count):
            sspec["flows"].append({"id": fid, "src": src, "src_addr": fab.nic_address(src), "device": fab.nic_ifname(src),
                                   "dst": dst, "dst_addr": fab.nic_address(dst), "sport": 41000 + fid, "dport": 47000,
                                   "rate_mbit": mbit})
            lis["flows"].append({"id": fid, "src": src})
            fid += 1
    return specs


def measured(results: dict[str, dict], src: str, dst: str) -> dict:
    """Totals of one directed pair: sent, received, loss, payload Mbit/s, OWD p50/p99 (worst window)."""
    sent = sum(sum(t["sent"]) for r in results.values() for t in r["tx"] if (t["src"], t["dst"]) == (src, dst))
    rx = next(x for r in results.values() for x in r["rx"] if (x["src"], x["nic"]) == (src, dst))
    received = sum(rx["received"])
    duration = next(iter(results.values()))["duration_s"]
    owd = [w for w in rx["owd_us"] if w]
    return {"sent": sent, "received": received, "loss": 1 - received / sent if sent else None,
            "mbit": sum(rx["bytes"]) * 8 / duration / 1e6, "p50_us": max((w["p50"] for w in owd), default=None),
            "p99_us": max((w["p99"] for w in owd), default=None)}


# -- cables under load -------------------------------------------------------------------------------


def test_a_rate_limited_cable_passes_idle_and_caps_loaded_throughput_within_tolerance(fab, tmp_path):
    nic, peer = "node0000/nic0", "node0002/nic0"
    fid = fab.fault_link_rate("node0000/nic0~leaf-su00-r0", rate_mbit=20, direction="both", latency_ms=50)
    assert fab.ground_truth()["culprits"] == [{"kind": "nic", "name": nic, "confidence": 1.0}]
    idle = probe(fab, nic, peer, count=100, flows=10, interval=0.005)
    assert idle["lost"] == 0  # an idle probe sees a healthy cable
    results = load(fab, tmp_path, pair_specs(fab, [(nic, peer, 4, 10.0), ("node0001/nic0", "node0003/nic0", 4, 10.0)]))
    limited, clean = measured(results, nic, peer), measured(results, "node0001/nic0", "node0003/nic0")
    expected = 20 * PAYLOAD / (PAYLOAD + FRAME_OVERHEAD)  # the bucket counts frames, we count payload
    assert abs(limited["mbit"] - expected) / expected < 0.15, limited
    assert 0.35 < limited["loss"] < 0.65, limited  # 40 Mbit/s offered into 20
    assert limited["p99_us"] > 10_000, limited  # the queue behind the bucket: tens of ms under load
    assert clean["loss"] < 0.01 and clean["mbit"] > 0.9 * 40 * 0.97, clean  # the control pair is untouched
    assert all(not r["errors"] for r in results.values()), [r["errors"] for r in results.values()]
    fab.heal(fid)


def test_a_policed_cable_passes_idle_and_drops_only_under_load(fab, tmp_path):
    nic, peer = "node0001/nic1", "node0003/nic1"
    fid = fab.fault_link_police("node0001/nic1~leaf-su00-r1", rate_mbit=4, direction="a>b")
    assert fab.ground_truth()["culprits"] == [{"kind": "nic", "name": nic, "confidence": 1.0}]
    assert probe(fab, nic, peer, count=200, flows=20, interval=0.005)["lost"] == 0
    assert fab.fault_stats(fid)["dropped_packets"] == 0
    results = load(fab, tmp_path, pair_specs(fab, [(nic, peer, 4, 4.0), (peer, nic, 4, 4.0)]))
    out, back = measured(results, nic, peer), measured(results, peer, nic)
    assert 0.6 < out["loss"] < 0.9, out  # 16 Mbit/s offered, 4 pass
    assert out["p99_us"] < 5_000, out  # a policer drops; it does not queue
    assert back["loss"] < 0.01, back  # only the direction leaving the NIC is policed
    assert fab.fault_stats(fid)["dropped_packets"] >= out["sent"] - out["received"] - 5
    fab.heal(fid)
    results = load(fab, tmp_path, pair_specs(fab, [(nic, peer, 4, 4.0)], duration=1.5))
    assert measured(results, nic, peer)["loss"] < 0.01


def test_one_direction_lossy_loses_only_that_way_under_load(fab, tmp_path):
    nic, peer = "node0002/nic1", "node0000/nic1"
    fab.fault_link_loss("node0002/nic1~leaf-su01-r1", rate=0.1, direction="a>b")
    results = load(fab, tmp_path, pair_specs(fab, [(nic, peer, 2, 4.0), (peer, nic, 2, 4.0)]))
    out, back = measured(results, nic, peer), measured(results, peer, nic)
    assert 0.07 < out["loss"] < 0.13, out  # ~2000 packets: 10% within 3 standard deviations
    assert back["loss"] < 0.005, back


def test_a_nic_with_the_wrong_mtu_answers_small_probes_and_drops_large_packets(fab, tmp_path):
    nic = "node0002/nic0"
    fid = fab.fault_nic_mtu(nic, mtu=1200)
    assert fab.ground_truth()["culprits"] == [{"kind": "nic", "name": nic, "confidence": 1.0}]
    assert probe(fab, "node0000/nic0", nic, count=50, flows=10)["lost"] == 0  # 64-byte probes are fine
    results = load(fab, tmp_path, pair_specs(fab, [("node0000/nic0", nic, 2, 2.0), (nic, "node0000/nic0", 2, 2.0)],
                                             size=1400, duration=2.0))
    assert measured(results, "node0000/nic0", nic)["loss"] > 0.99  # 1428-byte frames do not fit its 1200
    assert measured(results, nic, "node0000/nic0")["loss"] < 0.01  # it fragments what it sends
    with pytest.raises(TestbedError, match="already has MTU"):
        fab.fault_nic_mtu("node0001/nic0", mtu=1500)
    fab.heal(fid)
    results = load(fab, tmp_path, pair_specs(fab, [("node0000/nic0", nic, 2, 2.0)], size=1400, duration=1.5))
    assert measured(results, "node0000/nic0", nic)["loss"] < 0.01


def test_a_switch_with_ecmp_off_sends_every_flow_up_one_uplink(fab):
    uplinks = ["leaf-su00-r0~spine-p0-00#0", "leaf-su00-r0~spine-p0-01#0"]
    side = {lk: ("a" if fab.link(lk).a.node == "leaf-su00-r0" else "b") for lk in uplinks}

    def spread() -> list[int]:
        before = {lk: tx(fab, lk)[side[lk]] for lk in uplinks}
        result = probe(fab, "node0000/nic0", "node0002/nic0", count=400, flows=100, interval=0.0002)
        assert result["lost"] == 0
        return [tx(fab, lk)[side[lk]] - before[lk] for lk in uplinks]

    assert min(spread()) > 100  # hashing spreads 100 flows over both uplinks
    fid = fab.fault_switch_ecmp_off("leaf-su00-r0")
    assert fab.ground_truth()["culprits"] == [{"kind": "switch", "name": "leaf-su00-r0", "confidence": 1.0}]
    counts = spread()
    assert sorted(counts)[0] < 5 and sorted(counts)[1] >= 400, counts  # all on one uplink
    fab.reapply_routes()  # route reprogramming (another fault healing) keeps hashing off
    counts = spread()
    assert sorted(counts)[0] < 5, counts
    assert all("nexthops" not in r for r in fab.routes("leaf-su00-r0"))
    fab.heal(fid)
    assert min(spread()) > 100
    assert any("nexthops" in r for r in fab.routes("leaf-su00-r0"))


def test_the_loads_path_trace_sees_a_leaf_with_ecmp_off_put_every_flow_on_one_uplink(fab, tmp_path):
    from workers.audit.ecmp import TRACE_EXTRA, TRACE_TTL, check

    plan = plan_traffic(fab.topology, flows_per_nic=8, ports_per_pair=2)
    addresses = {n: fab.nic_address(n) for n in fab.nics}
    flows = [{"id": f.id, "src": f.src, "dst": f.dst} for f in plan.flows]

    def traced() -> dict[str, dict]:
        specs = agent_args(plan, fab.topology, addresses, run=next_run(), start_at=time.time() + 2.5, duration_s=1.0,
                           rate_mbit=0.5, packet_bytes=500, trace_ttl=TRACE_TTL, trace_extra=TRACE_EXTRA)
        results = load(fab, tmp_path, specs)
        assert all("paths" in r for r in results.values()), [r["errors"] for r in results.values()]
        return {e["switch"]: e for e in check(fab.topology, flows, [t for r in results.values() for t in r["paths"]],
                                                addresses)}

    healthy = traced()
    assert healthy and {e["status"] for e in healthy.values()} == {"pass"}, healthy  # real Linux hashing spreads
    fab.fault_switch_ecmp_off("leaf-su00-r0")
    off = traced()
    assert off["leaf-su00-r0"]["status"] == "fail" and len(off["leaf-su00-r0"]["hops"]) == 1, off
    assert {e["status"] for s, e in off.items() if s != "leaf-su00-r0"} == {"pass"}, off


# -- a GPU defect through the NVML fake ---------------------------------------------------------------


def _agent_audit(fab, host: str, sections: str = "gpu") -> dict:
    env = os.environ | nvmlshim.agent_env("hgx_h100") | {"LOCKSTEP_STATE_DIR": str(fab._agent_dir(host) / "state")}
    proc = fab.exec(host, [PY, "-m", "agent.audit", "node", "--sections", sections, "--args", '{"listen_ms": 10}'],
                    env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_gpu_defect_shows_in_the_hosts_audit_through_the_nvml_fake(fab, tmp_path):
    with pytest.raises(TestbedError, match="--fake-nvml"):
        fab.fault_node_gpu("node0001", defect="remap-pending", gpu=2)  # agents without the fake
    standin = [PY, str(Path(__file__).with_name("standin_agent.py"))]
    fab.start_agents(console_url="http://127.0.0.1:9", token="lse_AAAAAAAAAAAA.x", argv=standin,
                     env=nvmlshim.agent_env("hgx_h100"))
    try:
        before = _agent_audit(fab, "node0001")
        assert before["status"] == "pass" and before["hardware"] == "h100-sxm"
        assert len(before["facts"]["gpu"]["gpus"]) == 8
        fid = fab.fault_node_gpu("node0001", defect="remap-pending", gpu=2)
        truth = fab.ground_truth()
        assert truth["network_ok"] is True  # a GPU defect is not the network's
        assert truth["culprits"] == [{"kind": "host", "name": "node0001", "gpu": 2, "defect": "remap-pending",
                                      "confidence": 1.0}]
        with pytest.raises(TestbedError, match="defect 'melted'"):
            fab.fault_node_gpu("node0001", defect="melted")
        with pytest.raises(TestbedError, match="GPU 9 does not exist"):
            fab.fault_node_gpu("node0001", defect="ecc", gpu=9)
        during = _agent_audit(fab, "node0001")
        assert {(f["component"]["name"], f["code"]) for f in during["failures"]} == {
            ("GPU 2", "DCGM_FR_PENDING_ROW_REMAP"), ("GPU 2", "DCGM_FR_VOLATILE_DBE_DETECTED")}
        assert _agent_audit(fab, "node0003")["status"] == "pass"  # only that host
        fab.heal(fid)
        assert _agent_audit(fab, "node0001")["status"] == "pass"
    finally:
        fab.stop_agents()


# -- the plan on every host at once -------------------------------------------------------------------


def test_the_traffic_plan_loads_every_link_both_ways_and_its_windows_show_a_policed_nic(fab, tmp_path):
    plan = plan_traffic(fab.topology, flows_per_nic=8, ports_per_pair=2)
    assert plan.below_target() == [] and plan.uncoverable() == []
    fid = fab.fault_link_police("node0001/nic1~leaf-su00-r1", rate_mbit=1, direction="both")
    addresses = {n: fab.nic_address(n) for n in fab.nics}
    specs = agent_args(plan, fab.topology, addresses, run=next_run(), start_at=time.time() + 2.0, duration_s=3.0,
                       rate_mbit=1.0, packet_bytes=500, window_s=1.0)
    before = fab.all_link_counters()
    results = load(fab, tmp_path, specs)
    after = fab.all_link_counters()
    # every cable carried traffic in both directions while the plan ran (real Linux ECMP hashing)
    for lid in fab.links:
        for side in ("a", "b"):
            assert after[lid][side]["tx_packets"] - before[lid][side]["tx_packets"] > 50, (lid, side)
    merged = observations(plan, results)
    assert merged["missing"] == [] and len(merged["windows"]) == 3
    total = merged["total"]
    assert total["format"] == "lockstep.observations/v1" and total["topology"] == fab.topology.name
    for p in total["probes"]:
        loss = p["lost"] / p["sent"]
        through = "node0001/nic1" in (p["src"], p["dst"])
        assert (loss > 0.3) if through else (loss < 0.02), p  # 4 Mbit/s offered into a 1 Mbit/s policer
        assert p["owd_us"]["p50"] > 0 and p["offered_mbit"] > 0
    fab.heal(fid)
