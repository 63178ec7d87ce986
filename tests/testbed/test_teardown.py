"""Teardown leaves nothing behind: namespaces, veths, bridge, routes, nftables, cgroups, processes,
also after a bring-up killed half-way and after the state file is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import Fabric, generate, netops, procs
from testbed.plan import ns_re, root_link_re
from testbed.procs import CGROUP_TOP
from testbed.testing import unique_prefix, wait_for

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]
STANDIN = ["{python}", str(Path(__file__).with_name("standin_agent.py"))]


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "testbed", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert not check or proc.returncode == 0, proc.stderr
    return proc


def root_nft_tables() -> list:
    proc = netops.run(["nft", "-j", "list", "tables"], check=False)
    return [item for item in json.loads(proc.stdout or '{"nftables": []}')["nftables"] if "table" in item]


def leftovers(prefix: str, base: Path, mgmt_subnet: str | None = None) -> list[str]:
    found = [ns for ns in netops.list_netns() if ns_re(prefix).match(ns)]
    found += [link["ifname"] for link in netops.links() if root_link_re(prefix).match(link["ifname"])]
    if mgmt_subnet:
        found += [f"route {r['dst']}" for r in netops.root_routes() if r.get("dst") == mgmt_subnet]
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / CGROUP_TOP / prefix).exists():
            found.append(str(root / CGROUP_TOP / prefix))
    if (base / prefix).exists():
        found.append(str(base / prefix))
    found += [f"pid {p}" for p in procs.find_by_cmdline("testbed.flap", "--prefix", prefix)]
    return found


def busy_fabric(prefix: str, base: Path, fault_log: Path | None = None) -> tuple[Fabric, list, list]:
    """A fabric with agents, a flapping link, nftables and tc faults, and stray processes."""
    fab = Fabric.up(generate(hosts=3, rails=2, hosts_per_leaf=2, spines=2), prefix=prefix, base_dir=base,
                    fault_log=fault_log)
    fab.start_agents(console_url="http://192.0.2.1:9", token="lse_x.y", argv=STANDIN)
    fab.fault_link_loss("node0000/nic0~leaf-su00-r0", rate=0.1)
    fab.fault_switch_loss("spine-p0-01", rate=0.1)
    fab.fault_link_rate("node0001/nic0~leaf-su00-r0", rate_mbit=10)
    fab.fault_link_flap("leaf-su01-r1~spine-p0-00#0", period=0.2, duty=0.5)
    fab.fault_host_stall("node0002")  # frozen processes must die too
    spawned = fab.spawn("node0001", ["sleep", "300"])
    raw = subprocess.Popen(["ip", "netns", "exec", fab.ns("node0000"), "sleep", "300"])
    pids = [(r["pid"], r["start"]) for r in fab.refresh().state["agents"].values()]
    pids += [(f["apply"]["flapper"]["pid"], f["apply"]["flapper"]["start"])
             for f in fab.state["faults"].values() if "flapper" in f["apply"]]
    pids += [(p.pid, procs.start_time(p.pid)) for p in (spawned, raw)]
    assert all(procs.alive(p, s) for p, s in pids)
    return fab, pids, [spawned, raw]


def all_dead(pids, popens) -> bool:
    for p in popens:
        p.wait(timeout=10)  # reap our own children (they are killed by the teardown)
    return not any(procs.alive(p, s) for p, s in pids)


def test_down_removes_everything_and_closes_the_fault_log(base_dir, prefix, tmp_path):
    tables_before = root_nft_tables()
    log = tmp_path / "truth.jsonl"
    fab, pids, popens = busy_fabric(prefix, base_dir, fault_log=log)
    subnet = str(fab.plan.mgmt_subnet)
    assert fab.exec("node0000", ["nft", "list", "ruleset"]).stdout.count("numgen random") == 1
    assert leftovers(prefix, base_dir, subnet)  # the check sees a live testbed
    fab.down()
    assert all_dead(pids, popens)
    assert leftovers(prefix, base_dir, subnet) == []
    assert root_nft_tables() == tables_before
    events = [json.loads(line) for line in log.read_text().splitlines()]
    starts = {e["id"] for e in events if e["event"] == "start"}
    assert len(starts) == 5 and starts == {e["id"] for e in events if e["event"] == "end"}


def test_down_all_cleans_a_crashed_run_without_its_state(base_dir, prefix):
    fab, pids, popens = busy_fabric(prefix, base_dir)
    (fab.state_dir / "state.json").unlink()  # the crash took the state with it
    assert Fabric.down_all(base_dir) == [prefix]
    assert all_dead(pids, popens)
    assert leftovers(prefix, base_dir) == []


def test_bringup_killed_half_way_is_cleaned_by_down_all(base_dir):
    """SIGKILL `up` as soon as its first namespace exists, then `down --all`."""
    killed_while_building = False
    for _ in range(5):
        prefix = unique_prefix()
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "--prefix", prefix, "--state-dir", str(base_dir),
                                 "up", "--hosts", "16", "--rails", "2", "--hosts-per-leaf", "8", "--spines", "2"],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if any(ns_re(prefix).match(ns) for ns in netops.list_netns()):
                break
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        state = json.loads((base_dir / prefix / "state.json").read_text())
        killed_while_building = killed_while_building or state["phase"] == "building"
        assert leftovers(prefix, base_dir)
        out = cli("--prefix", prefix, "--state-dir", str(base_dir), "down", "--all")
        assert prefix in out.stdout
        assert leftovers(prefix, base_dir) == []
        if killed_while_building:
            break
    assert killed_while_building, "could not catch the bring-up half-way in 5 tries"


def test_down_all_spares_other_prefixes_and_lookalike_names(base_dir, another_base_dir):
    mine, other = unique_prefix(), unique_prefix()
    base_mine, base_other = base_dir, another_base_dir
    decoy_ns, decoy_link = f"{mine}x-decoy", f"{mine}mx"
    fabrics = []
    try:
        fabrics.append(Fabric.up(generate(hosts=2, rails=1, hosts_per_leaf=2, spines=1), prefix=mine,
                                 base_dir=base_mine))
        b = Fabric.up(generate(hosts=2, rails=1, hosts_per_leaf=2, spines=1), prefix=other, base_dir=base_other)
        fabrics.append(b)
        netops.ip_batch([f"netns add {decoy_ns}", f"link add {decoy_link} type bridge"])
        assert Fabric.down_all(base_mine) == [mine]
        assert leftovers(mine, base_mine) == []
        assert decoy_ns in netops.list_netns() and decoy_link in {x["ifname"] for x in netops.links()}
        assert set(b.plan.namespaces()) <= set(netops.list_netns())
        assert b.link_counters("node0000/nic0~leaf-su00-r0")["a"]["admin_up"]
    finally:
        netops.ip_batch([f"netns del {decoy_ns}", f"link del {decoy_link}"], force=True, check=False)
        Fabric.down_all(base_mine, [mine])
        Fabric.down_all(base_other, [other])
    assert leftovers(other, base_other) == []


def test_a_second_up_with_the_same_prefix_is_refused(base_dir, prefix):
    fab = Fabric.up(generate(hosts=2, rails=1, hosts_per_leaf=2, spines=1), prefix=prefix, base_dir=base_dir)
    try:
        out = cli("--prefix", prefix, "--state-dir", str(base_dir), "up", "--hosts", "2", check=False)
        assert out.returncode == 1 and "already recorded" in out.stderr
        wait_for(lambda: fab.link_counters("node0000/nic0~leaf-su00-r0")["a"]["carrier"], 5, "fabric intact")
    finally:
        fab.down()
