"""`lockstep.observations/v1`: parse and validate one probe window into arrays.

Pure: a document and a `PathIndex` in, a `Window` (numpy arrays, one row per directed pair) out.
Used by the fault triangulation (`workers.triangulation`) and meant for the console's telemetry
path, so both refuse the same documents with the same messages. Validation collects every
problem (up to MAX_ERRORS) with a path naming the offending entry (`probes[12].lost: ...`);
unknown keys are ignored (forward compatibility, formats/fabric.md).

What is refused: a document that is not an object, a wrong `format`, `probes` missing or not a
list, a probe that is not an object or lacks `src`/`dst`/`sent`/`lost`, a name that is not a NIC
of the topology, `src` = `dst`, counts that are not non-negative integers, `lost > sent`, an
`owd_us` that is not an object of non-negative numbers or has `p50 > p99`, a `path` that is not a
non-empty list of link ids, names an unknown link, does not start at `src`, passes through a NIC
or does not end at `dst`, and a (src, dst) pair given twice. A `topology` name different from
the topology's is reported in `Window.warnings`, not refused (the names may come from different
tools). `window_s`, when present, must be a positive number.

Known paths are walked for all rows at once; for each one the window keeps the links in order,
the direction each was crossed (True: from the link's `a` end to its `b` end) and the switches
visited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.fabric.paths import PathIndex

FORMAT = "lockstep.observations/v1"
MAX_ERRORS = 50


class ObservationsError(ValueError):
    """The document is not a valid observation window; `errors` lists every problem found."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        more = "" if len(errors) < MAX_ERRORS else f" (first {MAX_ERRORS} shown)"
        super().__init__(f"invalid {FORMAT} document{more}: " + "; ".join(errors))


@dataclass(frozen=True)
class Window:
    """One observation window as arrays over its rows (directed NIC pairs, document order).

    src, dst: NIC indices (PathIndex.nic_names order); sent, lost: counts; p50, p99: one-way
    delay percentiles in us (NaN when absent). Known paths: `path_rows` (row of each path),
    `path_ptr` (path j's links are path_links[path_ptr[j]:path_ptr[j + 1]]), `path_links` (link
    indices), `path_fwd` (crossed a -> b), `path_switch_ptr` / `path_switches` (switches visited,
    likewise).
    """

    src: np.ndarray
    dst: np.ndarray
    sent: np.ndarray
    lost: np.ndarray
    p50: np.ndarray
    p99: np.ndarray
    path_rows: np.ndarray
    path_ptr: np.ndarray
    path_links: np.ndarray
    path_fwd: np.ndarray
    path_switch_ptr: np.ndarray
    path_switches: np.ndarray
    window_s: float | None = None
    warnings: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.src)

    @property
    def has_path(self) -> np.ndarray:
        out = np.zeros(len(self.src), dtype=bool)
        out[self.path_rows] = True
        return out


class _Errors(list):
    def add(self, msg: str) -> None:
        if len(self) < MAX_ERRORS:
            self.append(msg)

    @property
    def full(self) -> bool:
        return len(self) >= MAX_ERRORS


def _is_count(v: Any) -> bool:
    return (type(v) is int and v >= 0) or (type(v) is float and v >= 0 and v.is_integer())


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_observations(doc: Any, index: PathIndex) -> Window:
    """Validate a `lockstep.observations/v1` document against `index.topology`; raise
    ObservationsError naming every problem, or return the Window."""
    errors = _Errors()
    if not isinstance(doc, dict):
        raise ObservationsError([f"document must be a JSON object, got {type(doc).__name__}"])
    if doc.get("format") != FORMAT:
        errors.add(f"format: expected {FORMAT!r}, got {doc.get('format')!r}")
    topo_name = index.topology.name
    warnings: list[str] = []
    if "topology" in doc and doc["topology"] != topo_name:
        warnings.append(f"topology: {doc['topology']!r} is not the name of the topology given ({topo_name!r})")
    window_s = doc.get("window_s")
    if window_s is not None and not (_is_number(window_s) and window_s > 0):
        errors.add(f"window_s: {window_s!r} is not a positive number")
        window_s = None
    probes = doc.get("probes")
    if not isinstance(probes, list):
        errors.add("missing required key 'probes'" if "probes" not in doc else
                   f"probes: must be a list, got {type(probes).__name__}")
        raise ObservationsError(errors)

    n = len(probes)
    nic_index = index.nic_index
    # Python lists while walking the rows (item assignment is cheaper than into numpy arrays)
    src = [-1] * n
    dst = [-1] * n
    sent = [0] * n
    lost = [0] * n
    p50 = [math.nan] * n
    p99 = [math.nan] * n
    path_rows: list[int] = []
    path_lists: list[list] = []
    nan = math.nan
    num = (int, float)
    for i, p in enumerate(probes):
        if type(p) is not dict:
            errors.add(f"probes[{i}]: must be an object, got {type(p).__name__}")
            if errors.full:
                break
            continue
        ps, pd = p.get("src"), p.get("dst")
        s = nic_index.get(ps, -1) if type(ps) is str else -1
        d = nic_index.get(pd, -1) if type(pd) is str else -1
        ns, nl = p.get("sent"), p.get("lost")
        if s < 0 or d < 0 or s == d or type(ns) is not int or type(nl) is not int or not 0 <= nl <= ns:
            before = len(errors)
            _row_errors(p, i, index, errors)
            if len(errors) == before:  # counts given as integral floats: accepted
                src[i], dst[i], sent[i], lost[i] = s, d, int(ns), int(nl)
            if errors.full:
                break
        else:
            src[i], dst[i], sent[i], lost[i] = s, d, ns, nl
        owd = p.get("owd_us")
        if owd is not None:
            if type(owd) is not dict:
                errors.add(f"probes[{i}].owd_us: must be an object, got {type(owd).__name__}")
            else:
                a, b = owd.get("p50", nan), owd.get("p99", nan)
                if (len(owd) != 2 or type(a) not in num or type(b) not in num or not 0 <= a <= b
                        or not (math.isfinite(a) and math.isfinite(b))):
                    _owd_errors(owd, i, errors)
                    a, b = (a if _is_number(a) else nan), (b if _is_number(b) else nan)
                p50[i], p99[i] = a, b
        path = p.get("path")
        if path is not None:
            if type(path) is not list or not path or not all(type(x) is str for x in path):
                errors.add(f"probes[{i}].path: must be a non-empty list of link ids")
            elif s >= 0:
                path_rows.append(i)
                path_lists.append(path)
        if errors and errors.full:
            break
    src, dst = np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)
    sent, lost = np.array(sent, dtype=np.int64), np.array(lost, dtype=np.int64)
    p50, p99 = np.array(p50, dtype=np.float64), np.array(p99, dtype=np.float64)
    if not errors.full:
        _duplicates(src, dst, index, errors)
    known = _walk_paths(np.array(path_rows, dtype=np.int64), path_lists, src, dst, index, errors)
    if errors:
        raise ObservationsError(errors)
    return Window(src, dst, sent, lost, p50, p99, *known,
                  window_s=float(window_s) if window_s is not None else None, warnings=tuple(warnings))


def window_of_arrays(index: PathIndex, src: np.ndarray, dst: np.ndarray, sent: np.ndarray, lost: np.ndarray,
                     p50: np.ndarray, p99: np.ndarray, paths: dict[int, list] | None = None,
                     window_s: float | None = None) -> Window:
    """The Window of rows already as arrays (src, dst: NIC indices of `index`; counts valid,
    0 <= p50 <= p99 or NaN): what `parse_observations` gives for the same rows as a document,
    with only the checks arrays leave open (src = dst, a pair twice, the known `paths`, row ->
    link ids) made. Raises ObservationsError naming the rows as `probes[i]`."""
    errors = _Errors()
    for i in np.flatnonzero(src == dst)[:MAX_ERRORS]:
        errors.add(f"probes[{i}]: src and dst are the same NIC {index.nic_names[src[i]]!r}")
    _duplicates(src, dst, index, errors)
    rows = sorted(paths or {})
    for i in rows:
        path = paths[i]
        if type(path) is not list or not path or not all(type(x) is str for x in path):
            errors.add(f"probes[{i}].path: must be a non-empty list of link ids")
    if errors:
        raise ObservationsError(errors)
    known = _walk_paths(np.array(rows, dtype=np.int64), [paths[i] for i in rows], src, dst, index, errors)
    if errors:
        raise ObservationsError(errors)
    return Window(src, dst, sent, lost, p50, p99, *known, window_s=window_s)


def _owd_errors(owd: dict, i: int, errors: _Errors) -> None:
    a, b = owd.get("p50"), owd.get("p99")
    for key, v in owd.items():
        if not (_is_number(v) and v >= 0):
            errors.add(f"probes[{i}].owd_us.{key}: {v!r} is not a non-negative number")
    if _is_number(a) and _is_number(b) and a > b:
        errors.add(f"probes[{i}].owd_us: p50 {a} is above p99 {b}")


def _row_errors(p: dict, i: int, index: PathIndex, errors: _Errors) -> None:
    where = f"probes[{i}]"
    topo = index.topology.name
    for key in ("src", "dst", "sent", "lost"):
        if key not in p:
            errors.add(f"{where}: missing required key {key!r}")
    for key in ("src", "dst"):
        v = p.get(key)
        if key in p and not (isinstance(v, str) and v in index.nic_index):
            errors.add(f"{where}.{key}: {v!r} is not a NIC of topology {topo!r}")
    if isinstance(p.get("src"), str) and p.get("src") == p.get("dst"):
        errors.add(f"{where}: src and dst are the same NIC {p['src']!r}")
    ns, nl = p.get("sent"), p.get("lost")
    for key, v in (("sent", ns), ("lost", nl)):
        if key in p and not _is_count(v):
            errors.add(f"{where}.{key}: {v!r} is not a non-negative integer")
    if _is_count(ns) and _is_count(nl) and nl > ns:
        errors.add(f"{where}.lost: {nl} is more than sent ({ns})")


def _duplicates(src: np.ndarray, dst: np.ndarray, index: PathIndex, errors: _Errors) -> None:
    ok = (src >= 0) & (dst >= 0)
    rows = np.flatnonzero(ok)
    key = src[rows] * len(index.nic_names) + dst[rows]
    order = np.argsort(key, kind="stable")
    dup = np.flatnonzero(np.diff(key[order]) == 0)
    for j in dup[:MAX_ERRORS]:
        first, again = int(rows[order[j]]), int(rows[order[j + 1]])
        errors.add(f"probes[{again}]: pair {index.nic_names[src[again]]} -> {index.nic_names[dst[again]]} "
                   f"already at probes[{first}]")


def _walk_paths(rows: np.ndarray, paths: list[list], src: np.ndarray, dst: np.ndarray,
                index: PathIndex, errors: _Errors):
    """Walk every known path at once; add an error per bad path (messages from PathIndex.walk)."""
    empty = np.zeros(0, dtype=np.int64)
    if rows.size == 0:
        return empty, np.zeros(1, dtype=np.int64), empty, np.zeros(0, dtype=bool), np.zeros(1, dtype=np.int64), empty
    n_sw = len(index.switch_names)
    lengths = np.fromiter((len(p) for p in paths), np.int64, len(paths))
    li = index.link_index
    links = np.fromiter((li.get(lid, -1) for p in paths for lid in p), np.int64, int(lengths.sum()))
    ptr = np.concatenate(([0], np.cumsum(lengths)))
    bad = np.zeros(len(rows), dtype=bool)
    bad[np.unique(np.repeat(np.arange(len(rows)), lengths)[links < 0])] = True
    cur = src[rows] + n_sw  # global node ids: switches 0..S-1, NICs S..
    fwd = np.zeros(len(links), dtype=bool)
    nodes = np.zeros(len(links), dtype=np.int64)
    safe = np.where(links < 0, 0, links)
    for j in range(int(lengths.max())):
        act = np.flatnonzero((lengths > j) & ~bad)
        k = safe[ptr[act] + j]
        a, b = index.link_node_a[k], index.link_node_b[k]
        here = cur[act]
        is_a, is_b = a == here, b == here
        wrong = ~(is_a | is_b) | ((j > 0) & (here >= n_sw))
        bad[act[wrong]] = True
        nxt = np.where(is_a, b, a)
        fwd[ptr[act] + j] = is_a
        nodes[ptr[act] + j] = nxt
        cur[act] = nxt
    bad |= cur != dst[rows] + n_sw
    for r in np.flatnonzero(bad):
        i = int(rows[r])
        try:
            walked = index.walk(index.nic_names[src[i]], paths[r])
        except ValueError as exc:
            errors.add(f"probes[{i}].{exc}")
        else:
            errors.add(f"probes[{i}].path: ends at {walked[-1]!r}, not at dst {index.nic_names[dst[i]]!r}")
        if errors.full:
            break
    # switches visited: every node reached except the last of each path
    inner = np.ones(len(links), dtype=bool)
    inner[ptr[1:] - 1] = False
    sw_ptr = np.concatenate(([0], np.cumsum(lengths - 1)))
    return rows, ptr, links, fwd, sw_ptr, nodes[inner]
