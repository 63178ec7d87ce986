"""The load generator's results as ``lockstep.observations/v1`` windows. Pure.

Each agent's ``audit.load`` result counts, per window of the send time, what its flows sent
(``tx``) and what its NICs received per source NIC (``rx``, with one-way delay percentiles).
This merges them per directed NIC pair: ``sent`` from the senders, ``lost = sent - received``,
``owd_us`` from the receiver. A window per ``window_s`` of the run, and one for the whole run
(``total``: the median window's p50 and the worst window's p99). Extra keys per probe (ignored by readers of the format, which must skip unknown
keys): ``bytes``, ``throughput_mbit``, ``offered_mbit``, ``flows``.

A pair whose sender or receiver did not report is left out of the windows and listed in
``missing`` (it is neither a loss nor a pass: the audit reports those agents as not audited).
"""

from __future__ import annotations

from workers.trafficplan.plan import TrafficPlan

OBSERVATIONS = "lockstep.observations/v1"


def observations(plan: TrafficPlan, results: dict[str, dict]) -> dict:
    """{"windows": [observations/v1 per window], "total": observations/v1, "missing": [...], "pacing": {...}}.

    ``results``: host -> that agent's ``audit.load`` result (hosts that did not answer: absent).
    """
    if not results:
        return {"windows": [], "total": None, "missing": [], "pacing": {}}
    first = next(iter(results.values()))
    n_windows, window_s = int(first["windows"]), float(first["window_s"])
    sent: dict[tuple[str, str], list[int]] = {}
    sent_bytes: dict[tuple[str, str], list[int]] = {}
    flows_of: dict[tuple[str, str], int] = {}
    skipped: dict[str, int] = {}
    for res in results.values():
        if res.get("protocol") != "udp":
            continue
        for tx in res.get("tx", []):
            key = (tx["src"], tx["dst"])
            s = sent.setdefault(key, [0] * n_windows)
            b = sent_bytes.setdefault(key, [0] * n_windows)
            for w in range(min(n_windows, len(tx["sent"]))):
                s[w] += tx["sent"][w]
                b[w] += tx["bytes"][w]
            flows_of[key] = flows_of.get(key, 0) + 1
            skipped[tx["src"]] = skipped.get(tx["src"], 0) + tx.get("skipped", 0)
    received: dict[tuple[str, str], dict] = {}
    for res in results.values():
        if res.get("protocol") != "udp":
            continue
        for rx in res.get("rx", []):
            received[(rx["src"], rx["nic"])] = rx
    planned = sorted({(f.src, f.dst) for f in plan.flows})
    missing = [{"src": s, "dst": d, "missing": "sender" if (s, d) not in sent else "receiver"}
               for s, d in planned if (s, d) not in sent or (s, d) not in received]
    complete = [p for p in planned if p in sent and p in received]

    def probe(pair: tuple[str, str], ws: range) -> dict:
        rx = received[pair]
        s = sum(sent[pair][w] for w in ws)
        r = sum(rx["received"][w] for w in ws)
        rb = sum(rx["bytes"][w] for w in ws)
        sb = sum(sent_bytes[pair][w] for w in ws)
        seconds = len(ws) * window_s
        out = {"src": pair[0], "dst": pair[1], "sent": s, "lost": max(0, s - r)}
        per_window = [rx["owd_us"][w] for w in ws if rx["owd_us"][w]]
        if per_window:
            # one window: the receiver's percentiles; several: the median window's p50, the worst p99
            out["owd_us"] = {"p50": _median([o["p50"] for o in per_window]), "p99": max(o["p99"] for o in per_window)}
        return out | {"bytes": rb, "throughput_mbit": round(rb * 8 / seconds / 1e6, 3),
                      "offered_mbit": round(sb * 8 / seconds / 1e6, 3), "flows": flows_of[pair]}

    def doc(ws: range) -> dict:
        return {"format": OBSERVATIONS, "topology": plan.topology, "window_s": len(ws) * window_s,
                "probes": [probe(p, ws) for p in complete]}

    return {"windows": [doc(range(w, w + 1)) for w in range(n_windows)], "total": doc(range(n_windows)),
            "missing": missing, "pacing": {"skipped_packets": skipped}}


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _merged(src: str, dst: str, parts: list[dict], seconds: float) -> dict:
    """One probe from a pair's consecutive window probes: counts added, throughput over `seconds`,
    the median window's p50 and the worst p99."""
    rb = sum(p["bytes"] for p in parts)
    out = {"src": src, "dst": dst, "sent": sum(p["sent"] for p in parts), "lost": sum(p["lost"] for p in parts)}
    owd = [p["owd_us"] for p in parts if p.get("owd_us")]
    if owd:
        out["owd_us"] = {"p50": _median([o["p50"] for o in owd]), "p99": max(o["p99"] for o in owd)}
    return out | {"bytes": rb, "throughput_mbit": round(rb * 8 / seconds / 1e6, 3),
                  "offered_mbit": round(sum(p["offered_mbit"] for p in parts) / len(parts), 3),
                  "flows": parts[0]["flows"]}


def combine_measured(docs: list[dict], first_window: dict[str, int], min_windows: int) -> tuple[dict | None, list[dict]]:
    """One observations/v1 window of every pair over the windows both its ends were loading in.

    ``first_window``: NIC -> the first window its agent was running in (a late start: the windows
    before it hold packets its receiver never listened for, or that it never sent); a NIC absent
    from it starts at 0. A pair counts from the later of its two ends' first windows to the end;
    a pair with fewer than ``min_windows`` such windows is *not measured* (never passed). So one
    late agent costs only its own pairs' first windows, not every pair's.

    Returns (the window, or None when no pair was measured; the pairs not measured, each
    ``{"src", "dst", "missing": "late", "windows": n}``). The window's ``window_s`` is the longest
    span a pair was measured over; each probe's throughput is over its own span.
    """
    if not docs:
        return None, []
    window_s = docs[0]["window_s"]
    by_pair: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for w, d in enumerate(docs):
        for p in d["probes"]:
            by_pair.setdefault((p["src"], p["dst"]), []).append((w, p))
    probes, unmeasured, longest = [], [], 0
    for (src, dst), parts in sorted(by_pair.items()):
        first = max(first_window.get(src, 0), first_window.get(dst, 0))
        used = [p for w, p in parts if w >= first]
        if len(used) < max(1, min_windows):
            unmeasured.append({"src": src, "dst": dst, "missing": "late", "windows": len(used)})
            continue
        longest = max(longest, len(used))
        probes.append(_merged(src, dst, used, len(used) * window_s))
    if not probes:
        return None, unmeasured
    return ({"format": OBSERVATIONS, "topology": docs[0]["topology"], "window_s": longest * window_s,
             "probes": probes}, unmeasured)
