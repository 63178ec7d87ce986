"""Consecutive short windows -> one observation window of their span (pure).

A window short enough to name a dark cable within a few hundred milliseconds holds few probes
per pair: a cable losing 5 % of them loses one or two per pair and window, which one window
alone may not tell from a burst. Summing the last windows' counts per pair gives the
triangulation the evidence of the whole span at the pace of the short window: each new window
is judged on itself and the windows before it (`span`), so a fault's evidence grows window by
window instead of restarting at every window boundary.

`span(docs)`: `lockstep.observations/v1` documents of consecutive windows of one cluster (oldest
first) -> one document: per directed pair `sent` and `lost` summed; one-way delay percentiles
the mean of the windows' weighted by their delivered probes (a delay that starts in the newest
window moves them by its share of the span); `owd_basis` `clock` only when every window's was;
`path` kept when every window gives the same; the lossy pairs' per-path breakdowns merged by
path; `start_ns` the oldest window's, `window_s` the span from it to the newest window's end.
"""

from __future__ import annotations

from typing import Any

FORMAT = "lockstep.observations/v1"


def windows_for(evidence_s: float, window_s: float) -> int:
    """How many consecutive windows of `window_s` make a span of about `evidence_s` (at least 1)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    return max(1, round(evidence_s / window_s))


def span(docs: list[dict]) -> dict:
    """One observation document of consecutive windows' (see the module docstring)."""
    if not docs:
        raise ValueError("span: no windows")
    if len(docs) == 1:
        return docs[0]
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in docs:
        for p in doc["probes"]:
            key = (p["src"], p["dst"])
            acc = pairs.get(key)
            if acc is None:
                acc = pairs[key] = {"src": p["src"], "dst": p["dst"], "sent": 0, "lost": 0, "_owd": [],
                                    "_paths": [], "_routes": {}, "_late": 0, "_unresolved": 0}
            acc["sent"] += p["sent"]
            acc["lost"] += p["lost"]
            acc["_late"] += p.get("late", 0)
            acc["_unresolved"] += p.get("unresolved", 0)
            if "owd_us" in p:
                acc["_owd"].append((max(1, p["sent"] - p["lost"]), p["owd_us"], p.get("owd_basis")))
            acc["_paths"].append(p.get("path"))
            for g in p.get("paths", []):
                route = tuple(g["path"]) if g.get("path") is not None else None
                merged = acc["_routes"].get(route)
                if merged is None:
                    acc["_routes"][route] = dict(g)
                else:
                    merged["sent"] += g["sent"]
                    merged["lost"] += g["lost"]
    probes = []
    for acc in pairs.values():
        probe = {"src": acc["src"], "dst": acc["dst"], "sent": acc["sent"], "lost": acc["lost"]}
        if acc["_owd"]:
            total = sum(w for w, _, _ in acc["_owd"])
            p50 = sum(w * o["p50"] for w, o, _ in acc["_owd"]) / total
            p99 = sum(w * o["p99"] for w, o, _ in acc["_owd"]) / total
            probe["owd_us"] = {"p50": round(p50, 3), "p99": round(max(p50, p99), 3)}
            probe["owd_basis"] = "clock" if all(b == "clock" for _, _, b in acc["_owd"]) else "half_rtt"
        paths = acc["_paths"]
        if all(p is not None and p == paths[0] for p in paths):
            probe["path"] = paths[0]
        if acc["_routes"]:
            probe["paths"] = sorted(acc["_routes"].values(), key=lambda g: (-g["lost"], -g["sent"]))
        if acc["_late"]:
            probe["late"] = acc["_late"]
        if acc["_unresolved"]:
            probe["unresolved"] = acc["_unresolved"]
        probes.append(probe)
    probes.sort(key=lambda p: (p["src"], p["dst"]))
    first, last = docs[0], docs[-1]
    out: dict[str, Any] = {"format": FORMAT}
    if "topology" in last:
        out["topology"] = last["topology"]
    if "start_ns" in first and "start_ns" in last and "window_s" in last:
        out["start_ns"] = first["start_ns"]
        out["window_s"] = round((last["start_ns"] - first["start_ns"]) / 1e9 + last["window_s"], 6)
    out["probes"] = probes
    return out
