"""The collective phase's groups and findings (workers.audit.collective)."""

from __future__ import annotations

from testbed import generate
from workers.audit.collective import findings, groups
from workers.fabric.topology import parse_topology

TOPOLOGY = parse_topology(generate(hosts=4, rails=2, hosts_per_leaf=2, spines=2))
HOSTS = sorted(h.name for h in TOPOLOGY.hosts)
ADDRESSES = {n.name: f"10.{n.rail}.0.{i + 1}" for i, n in enumerate(TOPOLOGY.nics)}
DEVICES = {n.name: f"eth{n.rail}" for n in TOPOLOGY.nics}


def test_a_group_per_rail_on_that_rails_nics_then_the_cluster_over_every_nic():
    planned = groups(TOPOLOGY, HOSTS, ADDRESSES, DEVICES, run=7)
    assert [(g["name"], g["step"]) for g in planned] == [("rail 0", "rails"), ("rail 1", "rails"),
                                                          ("cluster", "cluster")]
    rail1 = planned[1]
    assert [(m["host"], m["rank"], m["ifnames"]) for m in rail1["members"]] == [
        (h, r, ["eth1"]) for r, h in enumerate(HOSTS)]
    assert rail1["init"].startswith(f"tcp://{ADDRESSES[HOSTS[0] + '/nic1']}:")
    assert all(m["ifnames"] == ["eth0", "eth1"] for m in planned[2]["members"])
    assert len({g["init"].rsplit(":", 1)[1] for g in planned}) == 3  # a rendezvous port per group


def test_a_rail_missing_an_address_has_no_group():
    addresses = {k: v for k, v in ADDRESSES.items() if k != HOSTS[2] + "/nic1"}
    names = [g["name"] for g in groups(TOPOLOGY, HOSTS, addresses, DEVICES, run=7)]
    assert names == ["rail 0", "cluster"]


def test_findings_pass_a_fast_group_fail_a_slow_or_silent_one():
    def answer(status, busbw):
        return {"op": "all_reduce", "backend": "gloo", "errors": [],
                "check": {"status": status, "code": "" if status == "pass" else "DCGM_FR_LOW_BANDWIDTH",
                          "message": f"bus bandwidth {busbw}", "evidence": {"busbw_gbs": busbw},
                          "threshold": {"min_busbw_gbs": 1.0}}}

    out = findings([{"name": "rail 0", "world_size": 2, "answers": {"a": answer("pass", 5.0), "b": answer("pass", 5.0)}},
                    {"name": "rail 1", "world_size": 2, "answers": {"a": answer("fail", 0.1), "b": answer("fail", 0.1)}},
                    {"name": "cluster", "world_size": 2, "answers": {"a": answer("pass", 5.0), "b": None}}])
    assert [(f["element"]["name"], f["status"], f["code"]) for f in out] == [
        ("collective rail 0", "pass", ""), ("collective rail 1", "fail", "DCGM_FR_LOW_BANDWIDTH"),
        ("collective cluster", "fail", "LOCKSTEP_FR_COLLECTIVE_NOT_RUN")]
    assert not any(f["culprit"] for f in out) and "1 nodes did not answer (b)" in out[2]["message"]
