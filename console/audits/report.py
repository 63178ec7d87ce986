"""An audit's report: the JSON document, the page's context, and the PDF (WeasyPrint).

The page and the PDF show the same things from one context: the summary, every failed check
with its evidence and thresholds, the fabric map with the culprits marked, and the loaded pairs'
throughput as a heat map (source NIC x destination NIC, colored by the share delivered).
"""

from __future__ import annotations

from django.template.loader import render_to_string

from console.audits.models import AuditRun, NodeOutcome
from console.web.maps import cluster_map
from console.web.svg import render_map

# The heat map is drawn up to this many NICs a side (beyond it the page lists the worst pairs only).
HEATMAP_MAX_NICS = 96


def document(run: AuditRun) -> dict | None:
    """The report as JSON: run facts and the lockstep.audit.verdict/v1 document (None while running)."""
    if run.report is None or "format" not in run.report:
        return None
    return {"audit": run.pk, "cluster": run.cluster_id, "state": run.state, "verdict": run.verdict,
            "trigger": run.trigger, "created": run.created.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None, "plan": run.plan} | run.report


def _heat_color(delivered: float) -> str:
    """Green when everything arrived, through amber, to red at half lost or worse."""
    bad = min(1.0, max(0.0, (1.0 - delivered) * 2))
    r, g = int(60 + 190 * bad), int(170 - 110 * bad)
    return f"rgb({r},{g},70)"


def heatmap(pairs: list[dict]) -> dict | None:
    """Rows of cells (src NIC x dst NIC): share delivered, throughput, and a color."""
    nics = sorted({p["src"] for p in pairs} | {p["dst"] for p in pairs})
    if not nics or len(nics) > HEATMAP_MAX_NICS:
        return None
    by_pair = {(p["src"], p["dst"]): p for p in pairs}
    rows = []
    for src in nics:
        cells = []
        for dst in nics:
            p = by_pair.get((src, dst))
            if p is None or not p["sent"]:
                cells.append(None)
                continue
            delivered = 1 - p["lost"] / p["sent"]
            cells.append({"delivered": round(delivered, 4), "mbit": p.get("throughput_mbit"), "dst": dst,
                          "color": _heat_color(delivered),
                          "title": f"{src} -> {dst}: {delivered:.1%} delivered, {p.get('throughput_mbit')} Mbit/s"})
        rows.append({"src": src, "cells": cells})
    return {"nics": nics, "rows": rows}


def fabric_svg(run: AuditRun):
    """The cluster's fabric map with the run's culprits drawn down and the rest ok."""
    drawing = cluster_map(run.cluster)
    if drawing is None:
        return None
    culprits = (run.report or {}).get("culprits", [])
    health: dict[str, dict[str, str]] = {"node": {}, "switch": {}, "nic": {}, "link": {}}
    for kind, key in (("node", "hosts"), ("switch", "switches"), ("nic", "nics"), ("link", "links")):
        for element in getattr(drawing, key, ()):
            health[kind][element.get("name") or element.get("id")] = "ok"
    for c in culprits:
        kind = {"host": "node"}.get(c["kind"], c["kind"])
        if kind in health:
            health[kind][c["name"]] = "down"
    return render_map(drawing, health, f"Fabric of {run.cluster.name}: audit {run.pk} culprits in red")


def context(run: AuditRun) -> dict:
    report = run.report or {}
    fabric = report.get("fabric") or {}
    nodes = list(run.nodes.select_related("node").order_by("node__name"))
    findings = list(run.findings.all())
    total = len(nodes)
    done = sum(n.outcome != NodeOutcome.PENDING for n in nodes)
    return {
        "run": run,
        "cluster": run.cluster,
        "nodes": nodes,
        "findings": findings,
        "failed_findings": [f for f in findings if f.status == "fail"],
        "culprits": report.get("culprits", []),
        "not_audited": report.get("not_audited", []),
        "fleet": report.get("fleet"),
        "load": (run.plan or {}).get("load") or {},
        "heatmap": heatmap(fabric.get("pairs") or []),
        "pairs": len(fabric.get("pairs") or []),
        "progress": {"done": done, "total": total, "percent": int(100 * done / total) if total else 100,
                     "phase": run.get_phase_display()},
        "map_svg": fabric_svg(run),
    }


def pdf(run: AuditRun) -> bytes:
    """The report as a PDF."""
    from weasyprint import HTML  # imported here: pango is needed only when a PDF is asked for

    html = render_to_string("audits/report_pdf.html", context(run))
    return HTML(string=html).write_pdf()
