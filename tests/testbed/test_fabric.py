"""A small emulated fabric: it comes up, every NIC reaches every other, ECMP spreads flows."""

from __future__ import annotations

import json

import pytest

from testbed import netops
from testbed.testing import probe, start_server, stop, tx

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def responders(small_fabric):
    procs = [start_server(small_fabric, h, ["serve", "--port", "7000"]) for h in small_fabric.hosts]
    yield
    for p in procs:
        stop(p)


def test_fabric_is_built_as_planned(small_fabric):
    fab = small_fabric
    present = set(netops.list_netns())
    assert set(fab.plan.namespaces()) <= present
    for lid, link in fab.plan.links.items():
        for end in link.ends():
            (info,) = [i for i in netops.links(end.ns) if i["ifname"] == end.ifname]
            assert info.get("ifalias") == lid  # the link id is recoverable from the interface
            assert "UP" in info["flags"] and "LOWER_UP" in info["flags"]
    for nic in fab.nics:
        ns, ifname = fab.ns(nic), fab.nic_ifname(nic)
        addrs = json.loads(netops.run(["ip", "-n", ns, "-j", "addr", "show", "dev", ifname]).stdout)
        assert addrs[0]["addr_info"][0]["local"] == fab.nic_address(nic)
    spine = fab.ns("spine-p0-00")
    assert netops.run(["ip", "netns", "exec", spine, "cat", "/proc/sys/net/ipv4/fib_multipath_hash_policy"]
                      ).stdout.strip() == "1"
    status = fab.status()
    assert [h["name"] for h in status["hosts"]] == fab.hosts and all(link["up"] for link in status["links"])


def test_every_nic_reaches_every_other_nic(small_fabric, responders):
    fab = small_fabric
    for src in fab.nics:
        host = fab.topology.nic(src).host
        others = [n for n in fab.nics if fab.topology.nic(n).host != host]
        for result in probe(fab, src, others, count=5, flows=5):
            assert result["lost"] == 0, (src, result)


def test_probes_with_different_source_ports_take_different_ecmp_paths(small_fabric, responders):
    fab = small_fabric
    up0, up1 = "leaf-su00-r0~spine-p0-00#0", "leaf-su00-r0~spine-p0-01#0"
    before = {lid: tx(fab, lid) for lid in (up0, up1)}
    result = probe(fab, "node0000/nic0", "node0002/nic0", count=200, flows=200)
    assert result["lost"] == 0
    after = {lid: tx(fab, lid) for lid in (up0, up1)}
    upward = {lid: after[lid]["a"] - before[lid]["a"] for lid in (up0, up1)}  # leaf -> spine
    downward = {lid: after[lid]["b"] - before[lid]["b"] for lid in (up0, up1)}  # spine -> leaf (echoes)
    assert sum(upward.values()) >= 200 and sum(downward.values()) >= 200
    for lid in (up0, up1):  # both spines carry a fair share (binomial: 100 +- 7 expected)
        assert upward[lid] >= 50, upward
        assert downward[lid] >= 50, downward
    # flows to a host on the same leaf never touch the spines
    before = {lid: tx(fab, lid) for lid in (up0, up1)}
    assert probe(fab, "node0000/nic0", "node0001/nic0", count=100, flows=50)["lost"] == 0
    after = {lid: tx(fab, lid) for lid in (up0, up1)}
    assert all(after[lid]["a"] - before[lid]["a"] < 10 for lid in (up0, up1))


def test_cross_rail_traffic_goes_through_the_spines(small_fabric, responders):
    fab = small_fabric
    result = probe(fab, "node0000/nic0", "node0001/nic1", count=50, flows=50)
    assert result["lost"] == 0
    paths = fab.ecmp_paths("node0000/nic0", "node0001/nic1")
    assert len(paths) == 2 and all(len(p) == 4 for p in paths)


def test_hosts_route_per_nic(small_fabric):
    fab = small_fabric
    nic1 = fab.nic_address("node0000/nic1")
    dst = fab.nic_address("node0002/nic0")  # another rail: unbound traffic would leave via nic0
    out = fab.exec("node0000", ["ip", "-j", "route", "get", dst, "from", nic1], check=True).stdout
    assert json.loads(out)[0]["dev"] == "nic1"
    out = fab.exec("node0000", ["ip", "-j", "route", "get", dst], check=True).stdout
    assert json.loads(out)[0]["dev"] == "nic0"


def test_management_network_reaches_the_root_namespace_and_not_the_fabric(small_fabric):
    fab = small_fabric
    for host in fab.hosts:
        out = fab.exec(host, ["ip", "-j", "route", "get", fab.bridge_address], check=True).stdout
        assert json.loads(out)[0]["dev"] == "mgmt0"
        assert fab.exec(host, ["cat", "/proc/sys/net/ipv4/ip_forward"]).stdout.strip() == "0"
        mgmt_routes = [r for r in fab.routes(host) if r.get("dev") == "mgmt0"]
        assert [r["dst"] for r in mgmt_routes] == [str(fab.plan.mgmt_subnet)]
    # the root namespace knows nothing of the fabric: no route through the bridge to a NIC
    root = json.loads(netops.run(["ip", "-j", "route", "get", fab.nic_address("node0000/nic0")],
                                 check=False).stdout or "[{}]")
    assert root[0].get("dev") != fab.plan.bridge
    assert not [r for r in netops.root_routes() if r.get("dst", "").startswith("172.16.")
                and r.get("dev") == fab.plan.bridge]
    # a host reaches the console address (the root namespace's bridge) over UDP
    sock_test = fab.exec("node0001", ["python3", "-c", (
        "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
        f"s.connect(('{fab.bridge_address}',9));print(s.getsockname()[0])")], check=True).stdout.strip()
    assert sock_test == fab.mgmt_address("node0001")
