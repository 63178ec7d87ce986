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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    nic = r["nic"]
    for k, p in enumerate(r["probes"]):
        # the common entry, valid, checked in one expression; anything else by _check_entry,
        # which names what is wrong (a 1,024-NIC cluster posts ~47,000 entries a second)
        if type(p) is dict:
            src, dst, sent, lost, via = p.get("src"), p.get("dst"), p.get("sent"), p.get("lost"), p.get("via")
            unresolved, answered, late = p.get("unresolved", 0), p.get("answered", 0), p.get("late", 0)
            owd = p.get("owd_us")
            if (type(src) is str and src and type(dst) is str and dst and type(sent) is int and type(lost) is int
                    and 0 <= lost <= sent and ((via == "probe" and src == nic) or (via == "echo" and dst == nic))
                    and type(unresolved) is int and unresolved >= 0 and type(answered) is int and answered >= 0
                    and type(late) is int and late >= 0 and (owd is None or _is_owd(owd))):
                continue
        _check_entry(p, f"{where}.probes[{k}]", nic)
    for k, rx in enumerate(r.get("received", [])):
        if not isinstance(rx, dict) or not isinstance(rx.get("src"), str):
            raise ProbeWindowError(f"{where}.received[{k}]: must be {{src, start_ns, probes}}")
        _count(rx.get("probes"), f"{where}.received[{k}].probes")


def _check_entry(p: Any, pw: str, nic: str) -> None:
    """Raise ProbeWindowError naming the field of entry `pw` of NIC `nic`'s record that is wrong."""
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
    if p["via"] == "probe" and (p["src"] != nic):
        raise ProbeWindowError(f"{pw}.src: a probe entry of {nic!r} must start there")
    if p["via"] == "echo" and (p["dst"] != nic):
        raise ProbeWindowError(f"{pw}.dst: an echo entry of {nic!r} must end there")
    for key in ("unresolved", "answered", "late"):
        if key in p:
            _count(p[key], f"{pw}.{key}")
    owd = p.get("owd_us")
    if owd is not None and not _is_owd(owd):
        raise ProbeWindowError(f"{pw}.owd_us: must hold non-negative p50 and p99")


def _is_owd(owd: Any) -> bool:
    if not isinstance(owd, dict):
        return False
    for q in ("p50", "p99"):
        v = owd.get(q)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < math.inf:
            return False
    return True


def observations(records: list[dict], *, topology: str | None = None, half_rtt: bool = True) -> dict:
    """The observation window of one window's records (every NIC's of the cluster, same start)."""
    if not isinstance(records, list):
        raise ProbeWindowError("records: must be a list")
    for i, r in enumerate(records):
        check_record(r, i)
    starts = {r["start_ns"] for r in records}
    if len(starts) > 1:
        raise ProbeWindowError(f"records: {len(starts)} different windows (start_ns); give one window's records")
    return merge_records(records, half_rtt=half_rtt).to_document(topology)


@dataclass(frozen=True)
class Pairs:
    """A window's merged directed pairs as arrays, one row per pair in (src, dst) name order:
    what `observations` writes as its `probes` (row i is `probe(i)`), without building them.

    src, dst: indices into `names` (sorted NIC names); sent, lost, unresolved, late: counts;
    p50, p99: merged one-way delay (us, rounded as the document has them; NaN without);
    clock: the delays came from synchronized clocks; path / paths: row -> the pair's one path,
    row -> its per-path breakdown (only rows that have them)."""

    names: list[str]
    src: np.ndarray
    dst: np.ndarray
    sent: np.ndarray
    lost: np.ndarray
    unresolved: np.ndarray
    late: np.ndarray
    p50: np.ndarray
    p99: np.ndarray
    clock: np.ndarray
    path: dict[int, list] = field(default_factory=dict)
    paths: dict[int, list] = field(default_factory=dict)
    start_ns: int | None = None
    window_s: float | None = None

    def __len__(self) -> int:
        return len(self.src)

    def probe(self, i: int) -> dict[str, Any]:
        """Row i as a `lockstep.observations/v1` probe."""
        out: dict[str, Any] = {"src": self.names[self.src[i]], "dst": self.names[self.dst[i]],
                               "sent": int(self.sent[i]), "lost": int(self.lost[i])}
        if not math.isnan(self.p50[i]):
            out["owd_us"] = {"p50": float(self.p50[i]), "p99": float(self.p99[i])}
            out["owd_basis"] = "clock" if self.clock[i] else "half_rtt"
        if i in self.path:
            out["path"] = self.path[i]
        if i in self.paths:
            out["paths"] = self.paths[i]
        if self.unresolved[i]:
            out["unresolved"] = int(self.unresolved[i])
        if self.late[i]:
            out["late"] = int(self.late[i])  # of `lost`: answered after the deadline (a slow host, or a queue)
        return out

    def to_document(self, topology: str | None = None) -> dict:
        doc: dict[str, Any] = {"format": FORMAT}
        if topology is not None:
            doc["topology"] = topology
        if self.window_s is not None:
            doc["window_s"] = self.window_s
            doc["start_ns"] = self.start_ns
        doc["probes"] = [self.probe(i) for i in range(len(self))]
        return doc

    def take(self, rows: np.ndarray) -> Pairs:
        """The pairs of `rows` (ascending), renumbered."""
        new = {int(r): j for j, r in enumerate(rows)}
        return Pairs(self.names, self.src[rows], self.dst[rows], self.sent[rows], self.lost[rows],
                     self.unresolved[rows], self.late[rows], self.p50[rows], self.p99[rows], self.clock[rows],
                     {new[r]: p for r, p in self.path.items() if r in new},
                     {new[r]: p for r, p in self.paths.items() if r in new}, self.start_ns, self.window_s)


def _settled(r: dict, received: dict[tuple[str, str], int]) -> list[dict]:
    """A record's entries with its unresolved losses settled by the responders' counts (1. above)."""
    probes = r["probes"]
    if not any(p["via"] == "probe" and p.get("unresolved") for p in probes):
        return probes
    echoes = {(p["src"], p["dst"]): p for p in probes if p["via"] == "echo"}
    moved: dict[tuple[str, str], int] = {}  # probe entry (src, dst) -> unresolved that reached dst
    for p in probes:
        if p["via"] != "probe" or not p.get("unresolved"):
            continue
        got = received.get((r["start_ns"], p["src"], p["dst"]))
        echo = echoes.get((p["dst"], p["src"]))
        if got is not None and echo is not None:
            # the responder had these: their echoes were lost, not the probes
            moved[(p["src"], p["dst"])] = max(0, min(p["unresolved"], got - echo["sent"] - p.get("late", 0)))
    if not moved:
        return probes
    out = []
    for p in probes:
        e = p
        if p["via"] == "probe" and (p["src"], p["dst"]) in moved:
            n = moved[(p["src"], p["dst"])]
            e = {**p, "lost": p["lost"] - n, "unresolved": p["unresolved"] - n}
        elif p["via"] == "echo" and (p["dst"], p["src"]) in moved:
            n = moved[(p["dst"], p["src"])]
            e = {**p, "sent": p["sent"] + n, "lost": p["lost"] + n}
        out.append(e)
    return out


def _paths_by_route(breakdown: list[dict]) -> list[dict]:
    """Per-path counts of several windows, added up by path, lossiest first."""
    merged: dict = {}
    for g in breakdown:
        route = tuple(g["path"]) if g.get("path") is not None else None
        if route in merged:
            merged[route] = {**merged[route], "sent": merged[route]["sent"] + g["sent"],
                             "lost": merged[route]["lost"] + g["lost"]}
        else:
            merged[route] = dict(g)
    return sorted(merged.values(), key=lambda g: (-g["lost"], -g["sent"]))


def _round3(values: np.ndarray) -> np.ndarray:
    """Python's round(v, 3) of each value (the document's delays are those floats). numpy's
    round is not always the same float; where it gives back the value itself, the value is the
    float nearest a number of three decimals, which round(v, 3) gives back too: only the others
    (delays averaged over several entries) are rounded one by one."""
    out = np.round(values, 3)
    other = np.flatnonzero(out != values)
    out[other] = [round(v, 3) for v in values[other].tolist()]
    return out


def merge_records(records: list[dict], *, half_rtt: bool = True) -> Pairs:
    """The merged pairs of one window's records, already valid (`check_record`): the console
    checks each record once, as it arrives, and merges the window from its rows.

    Records of several consecutive windows of the same length merge into one span (an
    incident's evidence over short windows): per pair the counts add up, delays are weighted by
    their samples, a path is kept when every entry gives it, per-path breakdowns add up by path;
    `start_ns` is the oldest window's and `window_s` runs to the newest one's end."""
    starts = sorted({r["start_ns"] for r in records})
    start = starts[0] if starts else None
    received: dict[tuple[int, str, str], int] = {}  # (window, src, dst NIC) -> probes the responder had
    for r in records:
        for rx in r.get("received", ()):
            key = (rx.get("start_ns", r["start_ns"]), rx["src"], r["nic"])
            received[key] = received.get(key, 0) + rx["probes"]
    entries = [e for r in records for e in _settled(r, received)]
    n = len(entries)
    # one list comprehension per column, then one array each: the per-entry Python work is the
    # merge's cost (a 1,024-NIC window has ~47,000 entries)
    src_names = [e["src"] for e in entries]
    dst_names = [e["dst"] for e in entries]
    names = sorted(set(src_names).union(dst_names))
    rank = {name: i for i, name in enumerate(names)}
    src = np.array([rank[s] for s in src_names], np.int64).reshape(n)
    dst = np.array([rank[d] for d in dst_names], np.int64).reshape(n)
    sent = np.array([e["sent"] for e in entries], np.int64).reshape(n)
    lost = np.array([e["lost"] for e in entries], np.int64).reshape(n)
    unresolved = np.array([e.get("unresolved", 0) for e in entries], np.int64).reshape(n)
    late = np.array([e.get("late", 0) for e in entries], np.int64).reshape(n)
    owd = [e.get("owd_us") for e in entries]
    clock = np.array([e.get("owd_basis") == "clock" for e in entries], bool).reshape(n)
    usable = np.array([bool(o) for o in owd], bool).reshape(n)
    if not half_rtt:
        usable &= clock
    use = np.flatnonzero(usable).tolist()
    weight = np.zeros(n)
    a50, a99 = np.zeros(n), np.zeros(n)
    weight[use] = [max(1, int(entries[i].get("owd_samples") or 1)) for i in use]
    a50[use] = [owd[i]["p50"] for i in use]
    a99[use] = [owd[i]["p99"] for i in use]
    width = max(1, len(names))
    pair_keys, first, group = np.unique(src * width + dst, return_index=True, return_inverse=True)
    g = len(pair_keys)
    # bincount adds in entry order, as a sum over the group's entries does: the same floats
    total = np.bincount(group, weights=weight, minlength=g)
    s50 = np.bincount(group, weights=weight * a50, minlength=g)
    s99 = np.bincount(group, weights=weight * a99, minlength=g)
    not_clock = np.bincount(group, weights=usable & ~clock, minlength=g)

    def add(values: np.ndarray) -> np.ndarray:  # counts: exact as floats far beyond a window's
        return np.bincount(group, weights=values, minlength=g).astype(np.int64)

    g_sent, g_lost = add(sent), add(lost)
    p50 = np.full(g, math.nan)
    p99 = np.full(g, math.nan)
    timed = np.flatnonzero(total > 0)
    m50 = s50[timed] / total[timed]
    p50[timed] = _round3(m50)
    p99[timed] = _round3(np.maximum(m50, s99[timed] / total[timed]))
    # a pair's path: the one every entry of it gives; its breakdown: all its entries' (in order)
    routes = [e.get("path") for e in entries]
    routed = [i for i, route in enumerate(routes) if route is not None]
    members = np.bincount(group, minlength=g)
    with_path = np.bincount(group[routed], minlength=g) if routed else np.zeros(g, dtype=np.int64)
    path: dict[int, list] = {int(k): routes[first[k]] for k in np.flatnonzero(with_path == members)
                             if members[k]}
    group_of = group.tolist()
    for i in routed:
        k = group_of[i]
        if k in path and routes[i] != path[k]:
            del path[k]
    paths: dict[int, list] = {}
    for i, e in enumerate(entries):
        if e.get("paths"):
            paths.setdefault(group_of[i], []).extend(e["paths"])
    if len(starts) > 1:
        paths = {k: _paths_by_route(v) for k, v in paths.items()}
    window_s = None
    if records:
        newest = max(records, key=lambda r: r["start_ns"])
        window_s = round((newest["start_ns"] - start) / 1e9 + newest["window_s"], 6) if len(starts) > 1 \
            else records[0]["window_s"]
    keep = np.flatnonzero(g_sent > 0)
    merged = Pairs(names, pair_keys // width, pair_keys % width, g_sent, g_lost,
                   add(unresolved), add(late), p50, p99, not_clock == 0, path, paths, start, window_s)
    return merged if len(keep) == g else merged.take(keep)
