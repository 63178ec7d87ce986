"""The audit's verdict from its parts: every failing element named once, why, and the status rules
(a node not audited is never a pass; one that did not answer fails; warnings are not culprits)."""

from __future__ import annotations

from agent.audit.results import bad, ok, report
from workers.audit.fleet import agreement
from workers.audit.verdict import Missing, compose, fleet_facts, node_status


def node(host: str, *results, **facts) -> dict:
    return report("node", list(results) or [ok("gpu.ecc", {"kind": "gpu", "name": "GPU 0", "index": 0}, "ok")],
                  hardware="h100-sxm", facts={"host": {"kernel": "6.1", "nccl": ["2.23.4"]} | facts}, errors=[])


MTU = bad("nic.mtu", {"kind": "nic", "name": "nic1"}, "fail", "LOCKSTEP_FR_NIC_MTU", "config", "MTU 1200.", "Set it.",
          {"mtu": 1200}, {"mtu": 9000})
PERSIST = bad("gpu.persistence", {"kind": "gpu", "name": "GPU 1", "index": 1}, "warn", "DCGM_FR_PERSISTENCE_MODE",
              "config", "Persistence mode is off.", "Turn it on.")


def test_a_healthy_fleet_passes_with_no_finding():
    doc = compose({h: node(h) for h in ("a", "b")}, fleet=agreement(fleet_facts({h: node(h) for h in ("a", "b")})))
    assert doc["status"] == "pass" and doc["findings"] == [] and doc["culprits"] == []
    assert doc["verdict"] == {"format": "lockstep.verdict/v1", "network_ok": True, "culprits": []}


def test_a_node_check_names_the_nic_as_host_slash_device_and_a_warning_is_no_culprit():
    doc = compose({"a": node("a", MTU, PERSIST), "b": node("b")})
    assert doc["status"] == "fail"
    assert doc["culprits"] == [{"kind": "nic", "name": "a/nic1", "reasons": [
        {"check": "nic.mtu", "code": "LOCKSTEP_FR_NIC_MTU", "message": "MTU 1200."}]}]
    assert [(f["element"], f["status"], f["culprit"]) for f in doc["findings"]] == [
        ({"kind": "nic", "name": "a/nic1"}, "fail", True), ({"kind": "host", "name": "a", "gpu": 1}, "warn", False)]
    assert doc["verdict"]["network_ok"] is False


def test_not_audited_is_never_a_pass_and_no_answer_fails():
    doc = compose({"a": node("a"), "b": Missing("not_audited", "unreachable: the node is lost")})
    assert doc["status"] == "warn" and doc["not_audited"] == ["b"] and doc["culprits"] == []
    doc = compose({"a": node("a"), "b": Missing("no_answer", "no answer within 60 s")})
    assert doc["status"] == "fail" and [c["name"] for c in doc["culprits"]] == ["b"]
    assert node_status(Missing("not_audited", "")) == "not_audited" and node_status(Missing("no_answer", "")) == "failed"


def test_a_fleet_outlier_and_a_fabric_culprit_are_named_with_their_evidence():
    reports = {"a": node("a"), "b": node("b"), "c": node("c", nccl=["2.19.3"])}
    pairs = [{"src": "a/nic0", "dst": "b/nic0", "sent": 1000, "lost": 700, "throughput_mbit": 4.1, "offered_mbit": 16},
             {"src": "c/nic0", "dst": "b/nic0", "sent": 1000, "lost": 0, "throughput_mbit": 16, "offered_mbit": 16}]
    fabric = {"culprits": [{"kind": "nic", "name": "a/nic0", "confidence": 0.97}], "pairs": pairs, "missing": []}
    doc = compose(reports, fleet=agreement(fleet_facts(reports)), fabric=fabric)
    assert {(c["kind"], c["name"]) for c in doc["culprits"]} == {("host", "c"), ("nic", "a/nic0")}
    load = next(f for f in doc["findings"] if f["check"] == "fabric.load")
    assert load["evidence"]["pairs"] == [{"src": "a/nic0", "dst": "b/nic0", "sent": 1000, "lost": 700,
                                          "throughput_mbit": 4.1, "offered_mbit": 16, "owd_p99_us": None}]
    assert "lost 700 of 1000" in load["message"]
    fleet = next(f for f in doc["findings"] if f["check"] == "fleet.nccl")
    assert fleet["evidence"] == {"value": ["2.19.3"]} and fleet["threshold"] == {"reference": ["2.23.4"]}


def test_pairs_not_measured_under_load_are_a_warning():
    doc = compose({"a": node("a")}, fabric={"culprits": [], "pairs": [],
                                             "missing": [{"src": "a/nic0", "dst": "b/nic0", "missing": "receiver"}]})
    assert doc["status"] == "warn" and doc["findings"][0]["code"] == "LOCKSTEP_FR_LOAD_NOT_MEASURED"


def test_a_weakly_localized_fabric_element_is_a_warning_not_a_culprit():
    fabric = {"culprits": [{"kind": "host", "name": "b", "confidence": 0.53}], "pairs": [], "missing": []}
    doc = compose({"a": node("a"), "b": node("b")}, fabric=fabric)
    assert doc["status"] == "warn" and doc["culprits"] == []
    assert doc["findings"][0]["status"] == "warn" and "may lose or delay" in doc["findings"][0]["message"]
