"""Elements of a fabric and their columns over the pairs of one window.

The element space (one index per element and direction, `FabricModel` order):

- link directions: 2k (link k crossed a -> b) and 2k + 1 (b -> a), for every link;
- switches: 2L + s;
- NIC directions: tx (probes the NIC sends, its access link towards the fabric) and rx;
- host directions: tx and rx (all NICs of the host at once).

A single-homed NIC and its access link lie on exactly the same paths (formats/fabric.md), so the
access link's directions are never candidates: the NIC's tx/rx stand for them. Access links of
multi-homed NICs, direct NIC-NIC links and switch-switch links are link candidates.

The column of element e over the pairs i of a window is x[i, e], the fraction of pair i's
probes that cross e: 1 for an element of a known path, the share of the pair's ECMP paths
through e otherwise (workers.fabric.paths), 1 for the NIC and host directions of its ends.

Pairs without a known path and with single-homed ends see the fabric only through their two
root switches, so they are grouped into *route classes* (src switch, dst switch): fabric
columns are computed per class (a 9,216-GPU window of 147k pairs has ~23k classes) and spread
to the pairs of the class. Pairs with a known path get explicit rows.

`FabricModel(topology)` is built once per topology and caches what does not change between
windows: the PathIndex with its breadth-first searches, the element tables, and per route-class
set of the last few pair sets (a `ClassSet`; a stable probe plan reuses it every window) its
incidence and the ECMP columns of the elements asked for so far.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from workers.fabric.observations import Window
from workers.fabric.paths import Incidence, PathIndex
from workers.fabric.topology import Topology

KIND_LINK, KIND_SWITCH, KIND_NIC, KIND_HOST = 0, 1, 2, 3
KIND_NAMES = ("link", "switch", "nic", "host")
_CLASS_CACHE = 4
_COLUMN_ENTRIES = 2_000_000  # route-class column entries a ClassSet keeps (16 bytes each)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate arange(s, s + n) for every (s, n), vectorized."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return np.arange(total, dtype=np.int64) + offsets


class FabricModel:
    """Element tables and cached path structure of one topology (see the module docstring)."""

    def __init__(self, topology: Topology | PathIndex):
        self.index = topology if isinstance(topology, PathIndex) else PathIndex(topology)
        idx = self.index
        self.topology = idx.topology
        self.n_links = L = len(idx.link_ids)
        self.n_switches = S = len(idx.switch_names)
        self.n_nics = N = len(idx.nic_names)
        self.n_hosts = H = len(idx.host_names)
        self.n_fabric = 2 * L + S
        self.nic_tx0 = self.n_fabric
        self.nic_rx0 = self.n_fabric + N
        self.host_tx0 = self.n_fabric + 2 * N
        self.host_rx0 = self.n_fabric + 2 * N + H
        self.size = self.n_fabric + 2 * N + 2 * H
        kind = np.empty(self.size, dtype=np.int8)
        kind[: 2 * L] = KIND_LINK
        kind[2 * L: self.n_fabric] = KIND_SWITCH
        kind[self.nic_tx0: self.host_tx0] = KIND_NIC
        kind[self.host_tx0:] = KIND_HOST
        self.kind = kind
        # which single element each index reports as (link k, switch s, NIC n, host h)
        self.target = np.concatenate((np.repeat(np.arange(L), 2), np.arange(S), np.arange(N), np.arange(N),
                                      np.arange(H), np.arange(H))).astype(np.int64)
        # single-homed NICs' access links stand for the NIC: not candidates
        single = idx.nic_access[idx.nic_access >= 0]
        self.access_of_nic = idx.nic_access
        candidate = np.ones(self.size, dtype=bool)
        candidate[2 * single] = False
        candidate[2 * single + 1] = False
        self.candidate = candidate
        self.nic_host = idx.nic_host
        self.nics_per_host = np.bincount(idx.nic_host, minlength=H)
        self._classes: OrderedDict[bytes, ClassSet] = OrderedDict()
        self._exposures: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._warm = False
        self._ports: dict[int, list[tuple[int, int]]] | None = None
        self._sw_links: tuple[np.ndarray, np.ndarray] | None = None

    # ---- names ----------------------------------------------------------------------------

    def name(self, e: int) -> tuple[str, str]:
        """(kind, name) of the culprit an element index reports as."""
        k, t = int(self.kind[e]), int(self.target[e])
        idx = self.index
        return KIND_NAMES[k], (idx.link_ids, idx.switch_names, idx.nic_names, idx.host_names)[k][t]

    def label(self, e: int, both: bool = False) -> str:
        kind, name = self.name(e)
        if both and e < 2 * self.n_links:
            return f"link {name} (both directions)"
        if both and e >= self.nic_tx0:
            return f"{kind} {name} tx+rx"
        if e < 2 * self.n_links:
            k = e // 2
            a, b = self.index.link_a[k], self.index.link_b[k]
            return f"link {name} ({a} -> {b})" if e % 2 == 0 else f"link {name} ({b} -> {a})"
        if e >= self.nic_tx0:
            return f"{kind} {name} " + ("tx" if (e < self.nic_rx0 or self.host_tx0 <= e < self.host_rx0) else "rx")
        return f"{kind} {name}"

    def switch_ports(self) -> dict[int, list[tuple[int, int]]]:
        """Per switch, the culprit keys of its ports: (KIND_LINK, link) or, for the access link
        of a single-homed NIC, (KIND_NIC, nic)."""
        if self._ports is None:
            idx = self.index
            ports: dict[int, list[tuple[int, int]]] = {}
            for k, link in enumerate(idx.topology.links):
                for end, other in ((link.a, link.b), (link.b, link.a)):
                    s = idx.switch_index.get(end)
                    if s is None:
                        continue
                    nic = idx.nic_index.get(other)
                    single = nic is not None and idx.nic_access[nic] == k
                    ports.setdefault(s, []).append((KIND_NIC, nic) if single else (KIND_LINK, k))
            self._ports = ports
        return self._ports

    def switch_link_elements(self, s: int) -> np.ndarray:
        """Both direction elements of every switch-switch link at switch s."""
        if self._sw_links is None:
            idx = self.index
            inner = np.flatnonzero(idx.link_kind == 0)
            ends = np.concatenate((idx.link_switch_a[inner], idx.link_switch_b[inner]))
            links = np.concatenate((inner, inner))
            order = np.argsort(ends, kind="stable")
            ptr = np.searchsorted(ends[order], np.arange(self.n_switches + 1))
            self._sw_links = (links[order], ptr)
        links, ptr = self._sw_links
        mine = links[ptr[s]:ptr[s + 1]]
        return np.concatenate((2 * mine, 2 * mine + 1))

    def warm(self) -> None:
        """Run the breadth-first search of every NIC's root switch now (cached for all windows)."""
        if not self._warm:
            for r in np.unique(self.index.nic_switch[self.index.nic_switch >= 0]):
                self.index._root(int(r))
            self._warm = True

    # ---- windows --------------------------------------------------------------------------

    def prepare(self, window: Window) -> Prepared:
        return Prepared(self, window)

    def class_set(self, reps_src: np.ndarray, reps_dst: np.ndarray) -> ClassSet:
        """The route classes of a window (one representative pair each), cached per set."""
        key = hashlib.blake2b(reps_src.tobytes() + b"|" + reps_dst.tobytes(), digest_size=16).digest()
        hit = self._classes.get(key)
        if hit is not None:
            self._classes.move_to_end(key)
            return hit
        names = self.index.nic_names
        inc = self.index.incidence([(names[s], names[d]) for s, d in zip(reps_src.tolist(), reps_dst.tolist(),
                                                                            strict=True)])
        self._classes[key] = hit = ClassSet(inc, self.n_links)
        if len(self._classes) > _CLASS_CACHE:
            self._classes.popitem(last=False)
        return hit


class ClassSet:
    """The Incidence of one set of route classes and the ECMP columns of the fabric elements
    asked for so far (a stable probe plan asks for mostly the same ones every window). The
    column of element e: (classes, fractions), classes ascending, a class's legs summed."""

    def __init__(self, inc: Incidence, n_links: int):
        self.inc = inc
        self.n_links = n_links
        self._columns: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._entries = 0

    def columns(self, elements: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The columns of fabric elements (link directions and switches, FabricModel order)."""
        cache = self._columns
        missing = np.array(sorted({int(e) for e in elements.tolist()} - cache.keys()), dtype=np.int64)
        if missing.size:
            L = self.n_links
            is_link = missing < 2 * L
            r, c, v = self.inc.fraction_entries(missing[is_link] // 2, missing[is_link] % 2 == 0,
                                                missing[~is_link] - 2 * L)
            order = np.concatenate((np.flatnonzero(is_link), np.flatnonzero(~is_link)))
            k = len(missing)
            key, inv = np.unique(r * k + c, return_inverse=True)  # merge the legs of a class
            x = np.bincount(inv, weights=v)
            cls, col = key // k, key % k
            by_col = np.argsort(col, kind="stable")
            cut = np.searchsorted(col[by_col], np.arange(k + 1))
            for q in range(k):
                sel = by_col[cut[q]:cut[q + 1]]
                cache[int(missing[order[q]])] = (cls[sel], x[sel])
                self._entries += len(sel)
        out = []
        for e in elements.tolist():
            out.append(cache[e])
            cache.move_to_end(e)
        while self._entries > _COLUMN_ENTRIES and len(cache) > len(out):
            _, (cls, _) = cache.popitem(last=False)
            self._entries -= len(cls)
        return out


@dataclass
class Columns:
    """Columns of some elements: per route class (ecmp_*) and per pair (pair_*) entries."""

    elements: np.ndarray
    ecmp_class: np.ndarray
    ecmp_col: np.ndarray
    ecmp_x: np.ndarray
    pair_row: np.ndarray
    pair_col: np.ndarray
    pair_x: np.ndarray

    def transformed(self, fn) -> Columns:
        return Columns(self.elements, self.ecmp_class, self.ecmp_col, fn(self.ecmp_x),
                       self.pair_row, self.pair_col, fn(self.pair_x))


class Prepared:
    """One window over a FabricModel: route classes, known-path rows, hop counts."""

    def __init__(self, model: FabricModel, window: Window):
        self.model = model
        idx = model.index
        keep = window.sent > 0  # a pair that sent nothing says nothing
        rows = np.flatnonzero(keep)
        self.rows = rows  # window row of each pair
        self.src = window.src[rows]
        self.dst = window.dst[rows]
        self.sent = window.sent[rows].astype(np.float64)
        self.lost = window.lost[rows].astype(np.float64)
        self.p50 = window.p50[rows]
        self.p99 = window.p99[rows]
        n = self.n = len(rows)
        self.host_src = model.nic_host[self.src]
        self.host_dst = model.nic_host[self.dst]

        # known paths of the kept rows: their fabric elements
        pos_of_row = np.full(len(window), -1, dtype=np.int64)
        pos_of_row[rows] = np.arange(n)
        kp = pos_of_row[window.path_rows]
        has = kp >= 0
        self.known = np.zeros(n, dtype=bool)
        self.known[kp[has]] = True
        self.hops = np.full(n, -1, dtype=np.int64)
        lengths = np.diff(window.path_ptr)
        self.hops[kp[has]] = lengths[has]
        self._known_matrix(window, kp, has)

        # route classes of the other pairs
        ecmp = np.flatnonzero(~self.known)
        a = idx.nic_switch[self.src[ecmp]]
        b = idx.nic_switch[self.dst[ecmp]]
        n_sw = max(model.n_switches, 1)
        simple = (a >= 0) & (b >= 0)
        key = np.where(simple, a * n_sw + b, n_sw * n_sw + self.src[ecmp] * model.n_nics + self.dst[ecmp])
        ukey, first, cls = np.unique(key, return_index=True, return_inverse=True)
        self.ecmp = ecmp
        self.n_classes = len(ukey)
        self.pair_class = np.full(n, -1, dtype=np.int64)
        self.pair_class[ecmp] = cls
        order = np.argsort(cls, kind="stable")
        self.class_pairs = ecmp[order]
        self.class_ptr = np.concatenate(([0], np.cumsum(np.bincount(cls, minlength=self.n_classes))))
        reps = ecmp[first]
        self._class_key = self.src[reps].tobytes() + b"|" + self.dst[reps].tobytes()
        if len(reps):
            model.warm()
            self.classes: ClassSet | None = model.class_set(self.src[reps], self.dst[reps])
            self.inc: Incidence | None = self.classes.inc
            self.hops[ecmp] = self.inc.hops[cls]
        else:
            self.classes = None
            self.inc = None
        self.reachable = self.hops >= 0
        self._col_cache: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._scopes: dict[str, tuple] = {}
        # unreachable pairs (by the topology) still see their ends; count them as two hops
        self.hops_bg = np.where(self.reachable, self.hops, 2).astype(np.float64)

    def _known_matrix(self, window: Window, kp: np.ndarray, has: np.ndarray) -> None:
        """Sparse [pairs x fabric elements] rows of the known paths."""
        model = self.model
        lengths = np.diff(window.path_ptr)
        sw_lengths = np.diff(window.path_switch_ptr)
        pair_of_link = np.repeat(kp, lengths)
        links = window.path_links
        elem = 2 * links + (~window.path_fwd).astype(np.int64)
        keep = (pair_of_link >= 0) & model.candidate[elem] if len(elem) else np.zeros(0, dtype=bool)
        pair_of_sw = np.repeat(kp, sw_lengths)
        sw_elem = 2 * model.n_links + window.path_switches
        keep_sw = pair_of_sw >= 0
        r = np.concatenate((pair_of_link[keep], pair_of_sw[keep_sw]))
        c = np.concatenate((elem[keep], sw_elem[keep_sw]))
        self.known_csc = sp.csc_matrix((np.ones(len(r)), (r, c)), shape=(self.n, model.n_fabric))
        self.known_csc.sum_duplicates()

    # ---- operators ------------------------------------------------------------------------

    def class_sums(self, w: np.ndarray) -> np.ndarray:
        """Sum of per-pair weights (n or n x m) over the pairs of each route class."""
        w = np.asarray(w, dtype=np.float64)
        cls = self.pair_class[self.ecmp]
        if w.ndim == 1:
            return np.bincount(cls, weights=w[self.ecmp], minlength=self.n_classes)
        return np.stack([np.bincount(cls, weights=w[self.ecmp, j], minlength=self.n_classes)
                         for j in range(w.shape[1])], axis=1)

    def adjoint(self, w: np.ndarray, cache: bool = False) -> np.ndarray:
        """For per-pair weights w (n x m): per element e, sum_i x[i, e] w[i] (size x m).

        cache: the ECMP part (the costly dynamic programme) is kept by the FabricModel for the
        same route classes and class sums, so exposures (sent, sent x hops, pair counts) of a
        stable probe plan are computed once, not every window."""
        model = self.model
        w = np.asarray(w, dtype=np.float64).reshape(self.n, -1)
        m = w.shape[1]
        out = np.zeros((model.size, m))
        L = model.n_links
        if self.inc is not None and self.n_classes:
            wc = self.class_sums(w).reshape(self.n_classes, m)
            key = None
            if cache:
                key = hashlib.blake2b(self._class_key + wc.tobytes(), digest_size=16).digest()
                hit = model._exposures.get(key)
            if key is not None and hit is not None:
                fwd, rev, sw = hit
            else:  # one column at a time: the one-dimensional programme is the fastest
                parts = [self.inc.loads(wc[:, j]) for j in range(m)]
                fwd, rev, sw = (np.stack([pt[i] for pt in parts], axis=1) for i in range(3))
                if key is not None:
                    model._exposures[key] = (fwd, rev, sw)
                    if len(model._exposures) > _CLASS_CACHE:
                        model._exposures.pop(next(iter(model._exposures)))
            out[0: 2 * L: 2] = fwd.reshape(L, m)
            out[1: 2 * L: 2] = rev.reshape(L, m)
            out[2 * L: model.n_fabric] = sw.reshape(model.n_switches, m)
        out[: model.n_fabric] += self.known_csc.T @ w
        N, H = model.n_nics, model.n_hosts
        for j in range(m):
            out[model.nic_tx0: model.nic_rx0, j] = np.bincount(self.src, w[:, j], N)
            out[model.nic_rx0: model.host_tx0, j] = np.bincount(self.dst, w[:, j], N)
            out[model.host_tx0: model.host_rx0, j] = np.bincount(self.host_src, w[:, j], H)
            out[model.host_rx0:, j] = np.bincount(self.host_dst, w[:, j], H)
        out[~model.candidate] = 0.0
        return out

    def columns(self, elements: np.ndarray, scope: str | None = None) -> Columns:
        """The columns of the given element indices (FabricModel order), cached per element.

        scope: None for every pair; or the name of a set of pairs declared with set_scope (its
        route classes only; the pairs outside it get no entries)."""
        elements = np.asarray(elements, dtype=np.int64)
        cache = self._col_cache if scope is None else self._scopes[scope][1]
        missing = np.array([e for e in np.unique(elements) if int(e) not in cache], dtype=np.int64)
        if missing.size:
            got = self._compute_columns(missing, None if scope is None else self._scopes[scope][0])
            eo = np.argsort(got.ecmp_col, kind="stable")
            po = np.argsort(got.pair_col, kind="stable")
            ecut = np.searchsorted(got.ecmp_col[eo], np.arange(len(missing) + 1))
            pcut = np.searchsorted(got.pair_col[po], np.arange(len(missing) + 1))
            for q, e in enumerate(missing.tolist()):
                es, ps = eo[ecut[q]:ecut[q + 1]], po[pcut[q]:pcut[q + 1]]
                cache[e] = (got.ecmp_class[es], got.ecmp_x[es], got.pair_row[ps], got.pair_x[ps])
        parts = [cache[int(e)] for e in elements]
        ne = np.array([len(pt[0]) for pt in parts], dtype=np.int64)
        npr = np.array([len(pt[2]) for pt in parts], dtype=np.int64)
        cat = np.concatenate
        z, zf = np.zeros(0, dtype=np.int64), np.zeros(0)
        return Columns(
            elements,
            cat([pt[0] for pt in parts] + [z]), np.repeat(np.arange(len(elements)), ne), cat([pt[1] for pt in parts] + [zf]),
            cat([pt[2] for pt in parts] + [z]), np.repeat(np.arange(len(elements)), npr), cat([pt[3] for pt in parts] + [zf]),
        )

    def set_scope(self, name: str, pairs: np.ndarray) -> None:
        """Declare a set of pairs (indices) for columns(..., scope=name)."""
        classes = np.zeros(self.n_classes, dtype=bool)
        cls = self.pair_class[pairs]
        classes[cls[cls >= 0]] = True
        rows = np.zeros(self.n, dtype=bool)
        rows[pairs] = True
        self._scopes[name] = ((classes, rows), {})

    def _compute_columns(self, elements: np.ndarray, scope=None) -> Columns:
        model = self.model
        L = model.n_links
        cols = np.arange(len(elements))
        is_link = elements < 2 * L
        is_sw = (elements >= 2 * L) & (elements < model.n_fabric)
        ec = [np.zeros(0, dtype=np.int64)]
        ecol = [np.zeros(0, dtype=np.int64)]
        ex = [np.zeros(0)]
        if self.inc is not None and (is_link.any() or is_sw.any()):
            if scope is None:  # the window's every pair: the plan's cached columns
                fab = np.flatnonzero(is_link | is_sw)
                for q, (cls_q, x_q) in zip(fab.tolist(), self.classes.columns(elements[fab]), strict=True):
                    ec.append(cls_q)
                    ecol.append(np.full(len(cls_q), q, dtype=np.int64))
                    ex.append(x_q)
            else:  # a scope's classes only (few of them): computed for this window
                lk = elements[is_link] // 2
                fw = elements[is_link] % 2 == 0
                sws = elements[is_sw] - 2 * L
                r, c, v = self.inc.fraction_entries(lk, fw, sws, pairs=scope[0])
                colmap = np.concatenate((cols[is_link], cols[is_sw]))
                ec.append(r)
                ecol.append(colmap[c])
                ex.append(v)
        ecls = np.concatenate(ec)
        ecol_a = np.concatenate(ecol)
        ex_a = np.concatenate(ex)
        if ecls.size:  # merge duplicate (class, column) entries of multi-leg classes
            key = ecls * len(elements) + ecol_a
            uk, inv = np.unique(key, return_inverse=True)
            ex_a = np.bincount(inv, weights=ex_a)
            ecls, ecol_a = uk // len(elements), uk % len(elements)
        pr = []
        pc = []
        fab = np.flatnonzero(elements < model.n_fabric)
        if fab.size:
            sub = self.known_csc[:, elements[fab]].tocoo()
            keep = np.ones(len(sub.row), dtype=bool) if scope is None else scope[1][sub.row]
            pr.append(sub.row[keep].astype(np.int64))
            pc.append(fab[sub.col[keep]])
        edge = np.flatnonzero(elements >= model.n_fabric)
        if edge.size:
            pr_e, pc_e = self._edge_entries(elements[edge])
            pr.append(pr_e)
            pc.append(edge[pc_e])
        prow = np.concatenate(pr) if pr else np.zeros(0, dtype=np.int64)
        pcol = np.concatenate(pc) if pc else np.zeros(0, dtype=np.int64)
        return Columns(elements, ecls, ecol_a, ex_a, prow, pcol, np.ones(len(prow)))

    def _edge_entries(self, elements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        model = self.model
        groups = (
            (model.nic_tx0, model.nic_rx0, self.src),
            (model.nic_rx0, model.host_tx0, self.dst),
            (model.host_tx0, model.host_rx0, self.host_src),
            (model.host_rx0, model.size, self.host_dst),
        )
        rows, cols = [], []
        for lo, hi, end in groups:
            sel = np.flatnonzero((elements >= lo) & (elements < hi))
            if sel.size == 0:
                continue
            target = elements[sel] - lo
            lut = np.full(hi - lo, -1, dtype=np.int64)
            lut[target] = np.arange(len(sel))
            j = lut[end]
            r = np.flatnonzero(j >= 0)
            rows.append(r)
            cols.append(sel[j[r]])
        if not rows:
            z = np.zeros(0, dtype=np.int64)
            return z, z
        return np.concatenate(rows), np.concatenate(cols)

    def totals(self, cols: Columns, w: np.ndarray, w_class: np.ndarray | None = None) -> np.ndarray:
        """Per column: sum over all pairs of x * w (w per pair; w_class its class sums)."""
        k = len(cols.elements)
        wc = self.class_sums(w) if w_class is None else w_class
        out = np.bincount(cols.ecmp_col, weights=cols.ecmp_x * wc[cols.ecmp_class], minlength=k).astype(np.float64)
        out += np.bincount(cols.pair_col, weights=cols.pair_x * w[cols.pair_row], minlength=k)
        return out

    def restrict(self, cols: Columns, subset: np.ndarray) -> sp.csc_matrix:
        """The columns on the given pairs only: a csc [len(subset) x K] matrix."""
        k = len(cols.elements)
        pos = np.full(self.n, -1, dtype=np.int64)
        pos[subset] = np.arange(len(subset))
        # class entries -> the subset's pairs of that class
        in_sub = pos[self.class_pairs] >= 0
        sub_pairs = self.class_pairs[in_sub]
        sub_cls = self.pair_class[sub_pairs]
        order = np.argsort(sub_cls, kind="stable")
        sub_pairs = sub_pairs[order]
        cnt = np.bincount(sub_cls, minlength=self.n_classes)
        ptr = np.concatenate(([0], np.cumsum(cnt)))
        e_cnt = cnt[cols.ecmp_class]
        members = sub_pairs[_ranges(ptr[cols.ecmp_class], e_cnt)]
        r1 = pos[members]
        c1 = np.repeat(cols.ecmp_col, e_cnt)
        v1 = np.repeat(cols.ecmp_x, e_cnt)
        m2 = pos[cols.pair_row] >= 0
        r = np.concatenate((r1, pos[cols.pair_row[m2]]))
        c = np.concatenate((c1, cols.pair_col[m2]))
        v = np.concatenate((v1, cols.pair_x[m2]))
        keep = v > 0
        mat = sp.csc_matrix((v[keep], (r[keep], c[keep])), shape=(len(subset), k))
        mat.sum_duplicates()
        return mat
