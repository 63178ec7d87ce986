"""A cluster's ``probe.window`` records of one window -> one ``lockstep.observations/v1`` document.

Pure. Each agent sends one record per NIC and window (the shape is in docs/agent-protocol.md,
"Probe mesh"); a directed pair can be measured by two entries: the prober's probes (``via:
"probe"``, from src's record) and the echoes a responder sent back to a prober (``via: "echo"``,
from dst's record when dst probed src). Both are packets on that direction, so:

1. **Unresolved losses.** A prober's entry counts probes it could not tell the direction of
   (``unresolved``: no later echo came, the pair went dark) in its forward ``lost``. When the
   responder's record of the same window says how many of that prober's probes it received
   (``received``), the ones that reached it are moved to the reverse direction (their echoes
   were lost): forward lost = sent - received, so a dead reverse path is not blamed on the
   forward one. Without the responder's record (its agent is down) they stay forward losses.
2. **Merging.** Entries of the same (src, dst) add their ``sent`` and ``lost``; one-way delay
   percentiles are the sample-weighted mean of the entries' (exact when one entry has them all).
   ``owd_basis`` is ``clock`` only when every entry's delays came from synchronized clocks;
   with ``half_rtt=False`` delays that are half round trips are left out (``owd_us`` then means
   what the format says: synchronized clocks).
3. **Late.** ``late`` (an extension) says how many of ``lost`` were answered, after their deadline:
   a host too busy to answer at once, or a deep queue, rather than a drop.
4. **Paths.** ``path`` is kept when every merged entry gives the same one (all of the pair's
   ports took it); a lossy pair's per-path breakdown is kept as ``paths`` (an extension the
   format allows: unknown keys are ignored).

Errors (:class:`ProbeWindowError`) name the record and field (``records[3].probes[2].lost:
-1 is not a count``) and nothing is produced.
"""

from __future__ import annotations

import math
from typing import Any

FORMAT = "lockstep.observations/v1"
RECORD_FORMAT = "lockstep.probe.window/v1"


class ProbeWindowError(ValueError):
    """A record is malformed; the message names it and its field."""


def _count(v: Any, where: str) -> int:
    if type(v) is not int or v < 0:
        raise ProbeWindowError(f"{where}: {v!r} is not a count")
    return v


def check_record(r: Any, i: int | None = None) -> None:
    """Raise ProbeWindowError naming the field when `r` is not a valid probe.window record
    (what a console's telemetry validator for the kind needs); `i` prefixes `records[i]`."""
    where = f"records[{i}]" if i is not None else "data"
    if not isinstance(r, dict):
        raise ProbeWindowError(f"{where}: must be an object")
    if r.get("format") != RECORD_FORMAT:
        raise ProbeWindowError(f"{where}.format: expected {RECORD_FORMAT!r}, got {r.get('format')!r}")
    for key in ("nic", "start_ns", "window_s", "probes"):
        if key not in r:
            raise ProbeWindowError(f"{where}.{key}: required")
    if not isinstance(r["probes"], list):
        raise ProbeWindowError(f"{where}.probes: must be a list")
    for k, p in enumerate(r["probes"]):
        pw = f"{where}.probes[{k}]"
        if not isinstance(p, dict):
            raise ProbeWindowError(f"{pw}: must be an object")
        for key in ("src", "dst"):
            if not isinstance(p.get(key), str) or not p[key]:
                raise ProbeWindowError(f"{pw}.{key}: must be a NIC name")
        sent, lost = _count(p.get("sent"), f"{pw}.sent"), _count(p.get("lost"), f"{pw}.lost")
        if lost > sent:
            raise ProbeWindowError(f"{pw}.lost: {lost} is more than sent {sent}")
        if p.get("via") not in ("probe", "echo"):
            raise ProbeWindowError(f"{pw}.via: must be 'probe' or 'echo', not {p.get('via')!r}")
        if p["via"] == "probe" and (p["src"] != r["nic"]):
            raise ProbeWindowError(f"{pw}.src: a probe entry of {r['nic']!r} must start there")
        if p["via"] == "echo" and (p["dst"] != r["nic"]):
            raise ProbeWindowError(f"{pw}.dst: an echo entry of {r['nic']!r} must end there")
        for key in ("unresolved", "answered", "late"):
            if key in p:
                _count(p[key], f"{pw}.{key}")
        owd = p.get("owd_us")
        if owd is not None and not _is_owd(owd):
            raise ProbeWindowError(f"{pw}.owd_us: must hold non-negative p50 and p99")
    for k, rx in enumerate(r.get("received", [])):
        if not isinstance(rx, dict) or not isinstance(rx.get("src"), str):
            raise ProbeWindowError(f"{where}.received[{k}]: must be {{src, start_ns, probes}}")
        _count(rx.get("probes"), f"{where}.received[{k}].probes")


def _is_owd(owd: Any) -> bool:
    return isinstance(owd, dict) and all(
        isinstance(owd.get(q), (int, float)) and not isinstance(owd.get(q), bool) and math.isfinite(owd[q])
        and owd[q] >= 0 for q in ("p50", "p99"))


def observations(records: list[dict], *, topology: str | None = None, half_rtt: bool = True) -> dict:
    """The observation window of one window's records (every NIC's of the cluster, same start)."""
    if not isinstance(records, list):
        raise ProbeWindowError("records: must be a list")
    for i, r in enumerate(records):
        check_record(r, i)
    starts = {r["start_ns"] for r in records}
    if len(starts) > 1:
        raise ProbeWindowError(f"records: {len(starts)} different windows (start_ns); give one window's records")
    start = next(iter(starts), None)
    received: dict[tuple[str, str], int] = {}
    for r in records:
        for rx in r.get("received", []):
            if rx.get("start_ns", start) == start:
                key = (rx["src"], r["nic"])
                received[key] = received.get(key, 0) + rx["probes"]
    entries: list[dict] = []
    for r in records:
        probes = r["probes"]
        echoes = {(p["src"], p["dst"]): p for p in probes if p["via"] == "echo"}
        moved: dict[tuple[str, str], int] = {}  # probe entry (src, dst) -> unresolved that reached dst
        for p in probes:
            if p["via"] != "probe" or not p.get("unresolved"):
                continue
            got = received.get((p["src"], p["dst"]))
            echo = echoes.get((p["dst"], p["src"]))
            if got is not None and echo is not None:
                # the responder had these: their echoes were lost, not the probes
                moved[(p["src"], p["dst"])] = max(0, min(p["unresolved"], got - echo["sent"] - p.get("late", 0)))
        for p in probes:
            e = dict(p)
            if p["via"] == "probe" and (p["src"], p["dst"]) in moved:
                n = moved[(p["src"], p["dst"])]
                e["lost"] -= n
                e["unresolved"] -= n
            elif p["via"] == "echo" and (p["dst"], p["src"]) in moved:
                n = moved[(p["dst"], p["src"])]
                e["sent"] += n
                e["lost"] += n
            entries.append(e)
    merged: dict[tuple[str, str], list[dict]] = {}
    for e in entries:
        merged.setdefault((e["src"], e["dst"]), []).append(e)
    out = []
    for (src, dst), group in merged.items():
        sent = sum(e["sent"] for e in group)
        lost = sum(e["lost"] for e in group)
        if sent == 0:
            continue
        probe: dict[str, Any] = {"src": src, "dst": dst, "sent": sent, "lost": lost}
        owd = _merge_owd(group, half_rtt)
        if owd is not None:
            probe["owd_us"], probe["owd_basis"] = owd
        paths = [e.get("path") for e in group]
        if paths and all(p is not None and p == paths[0] for p in paths):
            probe["path"] = paths[0]
        breakdown = [g for e in group for g in e.get("paths", [])]
        if breakdown:
            probe["paths"] = breakdown
        unresolved = sum(e.get("unresolved", 0) for e in group)
        if unresolved:
            probe["unresolved"] = unresolved
        late = sum(e.get("late", 0) for e in group)
        if late:
            probe["late"] = late  # of `lost`: answered after the deadline (a slow host, or a queue)
        out.append(probe)
    out.sort(key=lambda p: (p["src"], p["dst"]))
    doc: dict[str, Any] = {"format": FORMAT}
    if topology is not None:
        doc["topology"] = topology
    if records:
        doc["window_s"] = records[0]["window_s"]
        doc["start_ns"] = start
    doc["probes"] = out
    return doc


def _merge_owd(group: list[dict], half_rtt: bool) -> tuple[dict, str] | None:
    usable = [e for e in group if e.get("owd_us") and (half_rtt or e.get("owd_basis") == "clock")]
    if not usable:
        return None
    weights = [max(1, int(e.get("owd_samples") or 1)) for e in usable]
    total = sum(weights)
    p50 = sum(w * e["owd_us"]["p50"] for w, e in zip(weights, usable, strict=True)) / total
    p99 = sum(w * e["owd_us"]["p99"] for w, e in zip(weights, usable, strict=True)) / total
    basis = "clock" if all(e.get("owd_basis") == "clock" for e in usable) else "half_rtt"
    return {"p50": round(p50, 3), "p99": round(max(p50, p99), 3)}, basis
