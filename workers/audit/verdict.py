"""An audit's verdict from its parts: node reports, fleet agreement and the fabric's localization. Pure.

    verdict = compose(node_reports, fleet=agreement(...), fabric=triangulation_doc, ...)

``node_reports``: node name -> its ``lockstep.audit.node/v1`` report, or a :class:`Missing` saying
why there is none (``not_audited``: the node was unreachable when the audit started, never a
pass; ``no_answer``: it did not answer in time, which fails the node with the reason).
``fleet``: ``workers.audit.fleet.agreement`` over the reports' host facts. ``fabric``: the
triangulation's ``lockstep.verdict/v1`` of the loaded windows (culprits among links, switches,
NICs and hosts), with ``pairs`` (the loaded per-pair totals, evidence), ``missing`` pairs and
``ecmp`` (``workers.audit.ecmp.check``: a leaf whose traced flows all left by one uplink is a
switch culprit).

Out: ``lockstep.audit.verdict/v1``: the status (``pass`` / ``warn`` / ``fail``; an audit with a node
not audited is never ``pass``), every finding with the element it names and why (code, message,
evidence and threshold), the culprits (one per element, its reasons), and ``not_audited``. Its
``verdict`` key is a ``lockstep.verdict/v1`` document of the culprits (what ``bench.audit`` scores).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.audit.ecmp import ALPHA as ECMP_ALPHA

FORMAT = "lockstep.audit.verdict/v1"
VERDICT_FORMAT = "lockstep.verdict/v1"
CODE_NO_ANSWER = "LOCKSTEP_FR_NO_ANSWER"
CODE_NOT_AUDITED = "LOCKSTEP_FR_NOT_AUDITED"
CODE_FABRIC = "LOCKSTEP_FR_FABRIC_UNDER_LOAD"
CODE_LOAD_MISSING = "LOCKSTEP_FR_LOAD_NOT_MEASURED"
CODE_ECMP = "LOCKSTEP_FR_ECMP_ONE_UPLINK"
CODE_ECMP_UNDECIDED = "LOCKSTEP_FR_ECMP_UNDECIDED"
_RANK = {"fail": 0, "error": 0, "warn": 1, "pass": 2}
# A loaded audit sends thousands of packets per pair: a real fault is localized with a confidence
# near 1. Below this, the element is reported as a warning to look at, not as a culprit (a host
# briefly starved of CPU delays what it receives without anything being broken).
FABRIC_CULPRIT_CONFIDENCE = 0.8


@dataclass(frozen=True)
class Missing:
    """Why a node has no report: ``not_audited`` (unreachable at the start) or ``no_answer``."""

    why: str  # "not_audited" | "no_answer"
    reason: str


def _element(node: str, component: dict) -> dict:
    """The fabric element a node check names: a NIC as ``<host>/<device>``, anything else as the host."""
    if component.get("kind") == "nic" and component.get("name"):
        return {"kind": "nic", "name": f"{node}/{component['name']}"}
    out = {"kind": "host", "name": node}
    if component.get("kind") == "gpu" and component.get("index") is not None:
        out["gpu"] = component["index"]
    return out


def _node_findings(node: str, report: dict | Missing) -> list[dict]:
    if isinstance(report, Missing):
        code = CODE_NOT_AUDITED if report.why == "not_audited" else CODE_NO_ANSWER
        status = "warn" if report.why == "not_audited" else "fail"
        return [{"phase": "nodes", "element": {"kind": "host", "name": node}, "check": "node.reachable",
                 "status": status, "code": code, "severity": "triage", "message": f"{node}: {report.reason}",
                 "evidence": {}, "threshold": {}, "culprit": report.why == "no_answer"}]
    out = []
    for item in report.get("failures", []):
        status = "fail" if item["status"] == "error" else item["status"]
        out.append({"phase": "nodes", "element": _element(node, item.get("component") or {}), "check": item["check"],
                    "status": status, "code": item.get("code", ""), "severity": item.get("severity", "none"),
                    "message": item["message"], "action": item.get("action", ""),
                    "evidence": item.get("evidence", {}), "threshold": item.get("threshold", {}),
                    "culprit": status == "fail"})
    return out


def _fleet_findings(fleet: dict | None) -> list[dict]:
    if not fleet:
        return []
    out = []
    for o in fleet.get("outliers", []):
        element = {"kind": "host", "name": o["node"]} if o["node"] else {"kind": "fleet", "name": o["key"]}
        out.append({"phase": "nodes", "element": element, "check": f"fleet.{o['key']}", "status": o["status"],
                    "code": o["code"], "severity": "config", "message": o["message"],
                    "evidence": {"value": o["value"]}, "threshold": {"reference": o["reference"]},
                    "culprit": o["status"] == "fail" and o["node"] is not None})
    return out


def _fabric_findings(fabric: dict | None) -> list[dict]:
    if not fabric:
        return []
    out = []
    pairs = fabric.get("pairs") or []
    for c in fabric.get("culprits", []):
        name = c["name"]
        through = [p for p in pairs if _touches(p, c["kind"], name)]
        lossy = sorted(through, key=lambda p: -(p["lost"] / p["sent"] if p["sent"] else 0))[:8]
        evidence = {"confidence": c.get("confidence"),
                    "pairs": [{"src": p["src"], "dst": p["dst"], "sent": p["sent"], "lost": p["lost"],
                               "throughput_mbit": p.get("throughput_mbit"), "offered_mbit": p.get("offered_mbit"),
                               "owd_p99_us": (p.get("owd_us") or {}).get("p99")} for p in lossy]}
        worst = lossy[0] if lossy else None
        why = (f"; worst pair {worst['src']} -> {worst['dst']} lost {worst['lost']} of {worst['sent']}"
               if worst and worst["sent"] else "")
        sure = c.get("confidence", 0) >= FABRIC_CULPRIT_CONFIDENCE
        out.append({"phase": "load", "element": {"kind": c["kind"], "name": name}, "check": "fabric.load",
                    "status": "fail" if sure else "warn", "code": CODE_FABRIC, "severity": "isolate" if sure else "monitor",
                    "message": f"{c['kind']} {name} {'loses or delays' if sure else 'may lose or delay'} traffic under "
                               f"load (localized from every loaded pair, confidence {c.get('confidence', 0):.2f}){why}",
                    "evidence": evidence, "threshold": {"confidence": FABRIC_CULPRIT_CONFIDENCE}, "culprit": sure})
    for e in fabric.get("ecmp") or []:
        if e["status"] == "pass":
            continue
        [hop] = e["hops"]
        fail = e["status"] == "fail"
        out.append({"phase": "load", "element": {"kind": "switch", "name": e["switch"]}, "check": "fabric.ecmp",
                    "status": "fail" if fail else "warn", "code": CODE_ECMP if fail else CODE_ECMP_UNDECIDED,
                    "severity": "isolate" if fail else "triage",
                    "message": (f"switch {e['switch']} sent all {e['flows']} traced flows to other leaves by one of its "
                                f"{e['uplinks']} uplinks (the next hop answered from {hop} for every one): ECMP hashing "
                                "is off or its other uplinks are out of its routes"
                                + ("" if fail else f"; too few flows to tell (chance {e['p_one_uplink']:.2g})")),
                    "action": "Check the switch's ECMP/hash configuration and the routes to its uplinks.",
                    "evidence": {k: e[k] for k in ("flows", "uplinks", "hops", "p_one_uplink")},
                    "threshold": {"p_one_uplink_max": ECMP_ALPHA}, "culprit": fail})
    missing = fabric.get("missing") or []
    if missing:
        out.append({"phase": "load", "element": {"kind": "fleet", "name": "fabric"}, "check": "fabric.coverage",
                    "status": "warn", "code": CODE_LOAD_MISSING, "severity": "triage",
                    "message": f"{len(missing)} loaded pairs were not measured (a sender or receiver did not report, "
                               "or started too late to be measured)",
                    "evidence": {"missing": missing[:20]}, "threshold": {}, "culprit": False})
    return out


def _touches(pair: dict, kind: str, name: str) -> bool:
    """Whether a pair's ends are the element (a NIC, a host); links and switches: every pair is
    evidence-eligible, the triangulation already chose them."""
    if kind == "nic":
        return name in (pair["src"], pair["dst"])
    if kind == "host":
        return any(p.split("/", 1)[0] == name for p in (pair["src"], pair["dst"]))
    return pair["lost"] > 0


def compose(node_reports: dict[str, dict | Missing], *, fleet: dict | None = None,
            fabric: dict | None = None, collective: list[dict] | None = None) -> dict:
    """The audit's verdict document (see the module docstring). `collective`: the collective
    phase's per-group findings (``workers.audit.collective.findings``); the passing ones are
    the report's, not findings."""
    findings = []
    for node in sorted(node_reports):
        findings += _node_findings(node, node_reports[node])
    findings += _fleet_findings(fleet)
    findings += _fabric_findings(fabric)
    findings += [f for f in collective or [] if f["status"] != "pass"]
    culprits: dict[tuple[str, str], dict] = {}
    for f in findings:
        if not f["culprit"]:
            continue
        key = (f["element"]["kind"], f["element"]["name"])
        entry = culprits.setdefault(key, {"kind": key[0], "name": key[1], "reasons": []})
        entry["reasons"].append({"check": f["check"], "code": f["code"], "message": f["message"]})
    not_audited = sorted(n for n, r in node_reports.items() if isinstance(r, Missing) and r.why == "not_audited")
    statuses = {f["status"] for f in findings}
    status = "fail" if "fail" in statuses else "warn" if statuses or not_audited else "pass"
    findings.sort(key=lambda f: (_RANK.get(f["status"], 3), f["phase"], f["element"]["name"], f["check"]))
    ordered = sorted(culprits.values(), key=lambda c: (c["kind"], c["name"]))
    return {
        "format": FORMAT,
        "status": status,
        "nodes": sorted(node_reports),
        "audited": sorted(n for n, r in node_reports.items() if not isinstance(r, Missing)),
        "not_audited": not_audited,
        "findings": findings,
        "culprits": ordered,
        "verdict": {"format": VERDICT_FORMAT, "network_ok": not any(c["kind"] in ("link", "switch", "nic")
                                                                   for c in ordered),
                    "culprits": [{"kind": c["kind"], "name": c["name"], "confidence": 1.0} for c in ordered]},
        "counts": {s: sum(f["status"] == s for f in findings) for s in ("fail", "warn")},
    }


def node_status(report: dict | Missing | None) -> str:
    """One node's own outcome: passed, warn, failed, not_audited (the console's AuditNode.status)."""
    if report is None:
        return "pending"
    if isinstance(report, Missing):
        return "not_audited" if report.why == "not_audited" else "failed"
    s = report.get("status", "error")
    return {"pass": "passed", "skip": "passed", "warn": "warn"}.get(s, "failed")


def fleet_facts(node_reports: dict[str, Any]) -> dict[str, dict]:
    """The host facts of every node that reported them (the input of the fleet agreement)."""
    return {n: r["facts"]["host"] for n, r in node_reports.items()
            if not isinstance(r, Missing) and isinstance(r.get("facts", {}).get("host"), dict)}
