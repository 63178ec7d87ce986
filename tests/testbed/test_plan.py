"""The pure part of the emulator: naming, addressing and routing plans (no root needed)."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from testbed import PlanError, build_plan, generate
from testbed.plan import MGMT_IFNAME, default_mgmt_subnet, ns_re, root_link_re
from workers.fabric.topology import parse_topology

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "data" / "scenarios"  # a copy of shared/scenarios


def plan_of(doc, prefix="lt", mgmt="10.201.0.0/16"):
    return build_plan(parse_topology(doc), prefix, mgmt)


def test_generated_topology_follows_the_shared_conventions():
    doc = generate(hosts=16, rails=2, hosts_per_leaf=8, spines=2)
    topo = parse_topology(doc)
    assert len(topo.hosts) == 16 and len(topo.nics) == 32
    assert [s.name for s in topo.switches] == ["leaf-su00-r0", "leaf-su00-r1", "leaf-su01-r0", "leaf-su01-r1",
                                               "spine-p0-00", "spine-p0-01"]
    ids = {link.id for link in topo.links}
    assert "node0000/nic0~leaf-su00-r0" in ids and "node0015/nic1~leaf-su01-r1" in ids
    assert "leaf-su01-r1~spine-p0-01#0" in ids
    assert len(topo.links) == 32 + 4 * 2
    with pytest.raises(ValueError, match="hosts_per_leaf"):
        generate(hosts=4, hosts_per_leaf=0)


def test_names_fit_interface_limits_and_addresses_are_unique():
    plan = plan_of(generate(hosts=16, rails=2, hosts_per_leaf=8, spines=2, links_per_spine=2))
    addresses = []
    for link in plan.links.values():
        for end in link.ends():
            assert len(end.ifname) <= 15
            assert end.peer_address == (link.b if end is link.a else link.a).address
            addresses.append(end.address)
    assert len(addresses) == len(set(addresses))
    for h in plan.hosts.values():
        assert len(h.mgmt_root_ifname) <= 15 and root_link_re("lt").match(h.mgmt_root_ifname)
        assert ipaddress.ip_address(h.mgmt_address) in plan.mgmt_subnet
        assert ns_re("lt").match(h.ns)
    assert plan.bridge == "ltmg" and plan.bridge_address == "10.201.0.1"
    assert plan.nics["node0000/nic0"].ifname == "nic0" and plan.nics["node0000/nic1"].ifname == "nic1"
    # every interface records its link id (the alias), so link ids are recoverable from the kernel
    aliases = dict(plan.aliases(plan.ns_of("leaf-su00-r0")))
    assert set(aliases.values()) == {lid for lid in plan.links if "leaf-su00-r0" in lid}
    assert (MGMT_IFNAME, "lockstep-testbed mgmt node0000") in plan.aliases(plan.ns_of("node0000"))


def test_switch_routes_are_multipath_over_every_shortest_path():
    plan = plan_of(generate(hosts=4, rails=2, hosts_per_leaf=2, spines=2, links_per_spine=2))
    leaf = plan.ns_of("leaf-su00-r0")
    far_block = plan.blocks["leaf-su01-r0"]
    (route,) = [r for r in plan.routes(leaf) if f" {far_block} " in r + " "]
    assert route.count("nexthop") == 4  # 2 spines x 2 parallel cables
    spine = plan.ns_of("spine-p0-00")
    (route,) = [r for r in plan.routes(spine) if f" {far_block} " in r + " "]
    assert route.count("nexthop") == 2  # the two parallel cables down to that leaf
    paths = plan.ecmp_paths("node0000/nic0", "node0002/nic0")
    assert len(paths) == 8 and all(p[0] == "node0000/nic0~leaf-su00-r0" and p[-1] == "node0002/nic0~leaf-su01-r0"
                                   for p in paths)
    assert plan.ecmp_paths("node0000/nic0", "node0001/nic0") == [["node0000/nic0~leaf-su00-r0",
                                                                  "node0001/nic0~leaf-su00-r0"]]


def test_withdrawn_links_are_routed_around_and_partitions_become_unreachable():
    plan = plan_of(generate(hosts=4, rails=1, hosts_per_leaf=2, spines=2))
    leaf0, far = plan.ns_of("leaf-su00-r0"), plan.blocks["leaf-su01-r0"]
    dead = "leaf-su01-r0~spine-p0-00#0"
    spine0_port = plan.links["leaf-su00-r0~spine-p0-00#0"].a.ifname
    (route,) = [r for r in plan.routes(leaf0, withdrawn=frozenset({dead})) if far in r]
    assert "nexthop" not in route and spine0_port not in route  # only via spine 1 now
    both = frozenset({dead, "leaf-su01-r0~spine-p0-01#0"})
    assert f"route replace unreachable {far}" in plan.routes(leaf0, withdrawn=both)
    # an administratively down port is never a next hop
    (route,) = [r for r in plan.routes(leaf0, down_ifnames=frozenset({spine0_port})) if far in r]
    assert spine0_port not in route


def test_hosts_route_per_nic_and_fall_back_when_a_nic_is_down():
    plan = plan_of(generate(hosts=4, rails=2, hosts_per_leaf=2, spines=1))
    ns = plan.ns_of("node0000")
    nic0, nic1 = plan.nics["node0000/nic0"], plan.nics["node0000/nic1"]
    batch = plan.ns_batch_create(ns)
    assert f"rule add from {nic0.address}/32 iif lo table {nic0.table} pref 1000" in batch
    assert f"rule add from {nic1.address}/32 iif lo table {nic1.table} pref 1001" in batch
    # the local table comes after them: NIC to NIC of one host goes through the fabric
    assert batch.index("rule add pref 30000 lookup local") < batch.index("rule del pref 0 lookup local")
    routes = plan.routes(ns)
    rail1_block = plan.blocks["leaf-su01-r1"]
    assert f"route replace {rail1_block} via {nic1.gateway} dev nic1 src {nic1.address}" in routes
    routes = plan.routes(ns, down_ifnames=frozenset({"nic1"}))
    assert f"route replace unreachable 172.16.0.0/12 table {nic1.table}" in routes
    assert f"route replace {rail1_block} via {nic0.gateway} dev nic0 src {nic0.address}" in routes
    assert plan.sysctls(ns) and ("net/ipv4/ip_forward", "0") in plan.sysctls(ns)
    assert ("net/ipv4/fib_multipath_hash_policy", "1") in plan.sysctls(plan.ns_of("spine-p0-00"))


def test_shared_scenario_topologies_can_be_emulated():
    files = sorted(SCENARIOS.glob("*/topology.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        plan = plan_of(doc)
        assert len(plan.namespaces()) == len(doc["hosts"]) + len(doc["switches"]), path
        nics = [n["name"] for n in doc["nics"]]
        assert len(plan.ecmp_paths(nics[0], nics[-1])) >= 2, path


def test_unemulatable_topologies_and_bad_parameters_are_named():
    doc = generate(hosts=2, rails=1, hosts_per_leaf=2, spines=1)
    doc["links"].append({"id": "extra", "a": "node0000/nic0", "b": "spine-p0-00"})
    with pytest.raises(PlanError, match=r"node0000/nic0.*2 links"):
        plan_of(doc)
    with pytest.raises(PlanError, match="prefix"):
        plan_of(generate(hosts=2), prefix="Bad-Prefix")
    with pytest.raises(PlanError, match="overlaps the fabric"):
        plan_of(generate(hosts=2), mgmt="172.16.0.0/16")
    assert default_mgmt_subnet("lt") != default_mgmt_subnet("lt", [default_mgmt_subnet("lt")])
