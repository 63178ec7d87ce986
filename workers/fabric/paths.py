"""ECMP paths between NICs of a `lockstep.topology/v1` fabric.

Pure: a `Topology` in, numbers and link ids out. No I/O, no clock, no Django. numpy does the bulk
work so that a 9,216-GPU three-tier fabric (1,152 hosts, 720 switches, ~24k links) is handled in
well under a second per window of probe pairs.

Model (formats/fabric.md): the fabric is an undirected multigraph whose nodes are NICs and
switches and whose edges are links; parallel links between two switches are distinct edges and
give distinct paths. A NIC reaches another NIC over every *shortest* path (ECMP); paths never
pass *through* a NIC (NICs are endpoints; hosts are not nodes at all). A path is a tuple of link
ids in order from the source NIC to the destination NIC. Without a known path, a pair's probes
are spread evenly over its ECMP paths, so "the fraction of a pair's probes that cross link L" is
(#ECMP paths through L) / (#ECMP paths).

How it scales: distances and path counts come from one breadth-first search per *root switch*
(the switch a NIC is attached to), computed on demand with numpy layer by layer and cached (a
9,216-GPU fabric needs 288 roots, 288 x 720 numbers each). Path counts are a dynamic programme
over those layers, never an enumeration: for an edge u->v on a shortest a->b path,
#paths(a->b through u->v) = cnt(a, u) * cnt(v, b). Enumerated paths (only when asked for) are
cached per switch pair.

API
---
`PathIndex(topology)` -- build once per topology; every method below is cheap after that.
Element order for arrays: `link_ids`, `switch_names`, `nic_names`, `host_names` (topology order),
with `link_index`, `switch_index`, `nic_index`, `host_index` mapping names to positions.

Per pair (names of NICs):
- `hop_count(src, dst) -> int | None`: links on a shortest path (2 on one leaf, 4 through a
  spine, 6 through a core); None when unreachable.
- `count_paths(src, dst) -> int`: number of ECMP paths, without enumerating them (0 when
  unreachable). Exact below 2**53.
- `paths(src, dst, limit=None) -> list[tuple[str, ...]]` and `iter_paths(src, dst)`: every ECMP
  path as a tuple of link ids in order. `limit` raises `TooManyPaths` instead of enumerating more.
- `link_fractions(src, dst) -> dict[link_id, float]`: fraction of the pair's ECMP paths through
  each link (even spreading); `switch_fractions(src, dst)` likewise for switches.
- `is_shortest_path(src, dst, path) -> bool`.

Per path (tuple of link ids, from a source NIC):
- `walk(src, path) -> tuple[str, ...]`: the nodes visited (src, switches..., dst); raises
  `ValueError` naming the first link that does not continue the walk.
- `path_switches(src, path)`, `path_links(path)`, `path_hops(path)`.

Per set of pairs: `incidence(pairs, paths=None) -> Incidence`. `paths[i]` (optional, may be None)
is the known path of pair i (an observation's `path`); pairs with a known path use it alone
(fraction 1 on its links), the others spread over their ECMP paths. `Incidence` is implicit
(it keeps per-pair route descriptors, not a pairs x links matrix, which would hold ~90M entries
on the 9,216-GPU fabric), and answers:
- `hops`, `npaths`, `reachable`: arrays over pairs.
- `link_fractions(link_ids, directed=False)`: dense [pairs x K] fractions for K chosen links, or
  a (a->b, b->a) tuple of them with `directed=True` (a and b are the link's ends as written in the
  topology). On its ECMP paths a pair crosses a given link in one direction only.
- `switch_fractions(names)`, `nic_counts(names)`, `host_counts(names)`: [pairs x K].
- `pairs_through(link_id)`: (pair indices, fractions) of the pairs that can cross the link.
- `loads(weights=None) -> (fwd, rev, switch)`, `link_loads(weights=None) -> (fwd, rev)` and
  `switch_loads(weights=None)`: for every link (in `link_ids` order) and switch (in
  `switch_names` order), the sum over pairs
  of weight x fraction, i.e. expected probe traversals when weights are probe counts; one
  dynamic programme per destination switch, [pairs x m] weights give m columns in one pass.
- `mean_path_product(link_fwd, link_rev=None, switch=None) -> [pairs]`: the mean over each
  pair's ECMP paths of the product of per-link (per direction) and per-switch factors; with
  survival probabilities as factors this is the exact delivery probability under even ECMP
  spreading, however many lossy elements a pair's paths cross.
- `sample_paths(rng)`: one ECMP path per pair drawn uniformly with the caller's
  `numpy.random.Generator` (known paths returned as given).
- `coo()`: the explicit (pair, link, fraction, forward) incidence, for small fabrics and tests.

`connected()` says whether every NIC reaches every other NIC.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from workers.fabric.topology import Topology

__all__ = ["Incidence", "PathIndex", "TooManyPaths"]

_PATH_CACHE_SIZE = 2048


class TooManyPaths(ValueError):
    """A pair has more ECMP paths than the caller's `limit` allows enumerating."""


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenate arange(s, e) for every (s, e), vectorized."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return np.arange(total, dtype=np.int64) + offsets


class PathIndex:
    """Shortest-path (ECMP) structure of one topology. See the module docstring."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.switch_names: tuple[str, ...] = tuple(s.name for s in topology.switches)
        self.nic_names: tuple[str, ...] = tuple(n.name for n in topology.nics)
        self.link_ids: tuple[str, ...] = tuple(link.id for link in topology.links)
        self.host_names: tuple[str, ...] = tuple(h.name for h in topology.hosts)
        self.switch_index = {name: i for i, name in enumerate(self.switch_names)}
        self.nic_index = {name: i for i, name in enumerate(self.nic_names)}
        self.link_index = {lid: i for i, lid in enumerate(self.link_ids)}
        self.host_index = {name: i for i, name in enumerate(self.host_names)}
        self.nic_host = np.array([self.host_index[n.host] for n in topology.nics], dtype=np.int64)
        self.link_a = tuple(link.a for link in topology.links)
        self.link_b = tuple(link.b for link in topology.links)

        n_sw = len(self.switch_names)
        tails: list[int] = []
        heads: list[int] = []
        elinks: list[int] = []
        efwd: list[bool] = []
        # attachments[nic] = [(link index, switch index)]; direct[nic] = [(link index, other nic)]
        self._attach: list[list[tuple[int, int]]] = [[] for _ in self.nic_names]
        self._direct: list[list[tuple[int, int]]] = [[] for _ in self.nic_names]
        self.link_kind = np.zeros(len(self.link_ids), dtype=np.int8)  # 0 sw-sw, 1 nic-sw, 2 nic-nic
        self.link_switch_a = np.full(len(self.link_ids), -1, dtype=np.int64)
        self.link_switch_b = np.full(len(self.link_ids), -1, dtype=np.int64)
        for i, link in enumerate(topology.links):
            sa, sb = self.switch_index.get(link.a), self.switch_index.get(link.b)
            if sa is not None and sb is not None:
                self.link_switch_a[i], self.link_switch_b[i] = sa, sb
                tails += [sa, sb]
                heads += [sb, sa]
                elinks += [i, i]
                efwd += [True, False]
            elif sa is None and sb is None:
                na, nb = self.nic_index[link.a], self.nic_index[link.b]
                self._direct[na].append((i, nb))
                self._direct[nb].append((i, na))
                self.link_kind[i] = 2
            else:
                nic = self.nic_index[link.b if sa is not None else link.a]
                sw = sa if sa is not None else sb
                self._attach[nic].append((i, sw))
                self.link_kind[i] = 1
                if sa is not None:
                    self.link_switch_a[i] = sa
                else:
                    self.link_switch_b[i] = sb
        # global node ids: switches 0..S-1, NICs S..S+N-1
        node_id = {name: i for i, name in enumerate(self.switch_names)}
        node_id.update({name: len(self.switch_names) + i for i, name in enumerate(self.nic_names)})
        self.link_node_a = np.array([node_id[a] for a in self.link_a], dtype=np.int64)
        self.link_node_b = np.array([node_id[b] for b in self.link_b], dtype=np.int64)
        order = np.lexsort((np.array(elinks, dtype=np.int64), np.array(tails, dtype=np.int64)))
        self._e_tail = np.array(tails, dtype=np.int64)[order]
        self._e_head = np.array(heads, dtype=np.int64)[order]
        self._e_link = np.array(elinks, dtype=np.int64)[order]
        self._e_fwd = np.array(efwd, dtype=bool)[order]
        self._ptr = np.searchsorted(self._e_tail, np.arange(n_sw + 1))
        self._n_sw = n_sw
        # single-homed fast path: the NIC's one access link and switch, or -1
        self.nic_access = np.array(
            [a[0][0] if len(a) == 1 and not d else -1 for a, d in zip(self._attach, self._direct, strict=True)],
            dtype=np.int64,
        )
        self.nic_switch = np.array(
            [a[0][1] if len(a) == 1 and not d else -1 for a, d in zip(self._attach, self._direct, strict=True)],
            dtype=np.int64,
        )
        self._roots: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._dag_cache: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
        self._sw_paths: OrderedDict[tuple[int, int], tuple[tuple[int, ...], ...]] = OrderedDict()

    # ---- per-root BFS ---------------------------------------------------------------------

    def _root(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(dist, cnt) from switch r to every switch: hops and number of shortest paths."""
        hit = self._roots.get(r)
        if hit is not None:
            return hit
        dist = np.full(self._n_sw, -1, dtype=np.int64)
        cnt = np.zeros(self._n_sw, dtype=np.float64)
        dist[r], cnt[r] = 0, 1.0
        frontier = np.array([r], dtype=np.int64)
        d = 0
        while frontier.size:
            idx = _ranges(self._ptr[frontier], self._ptr[frontier + 1])
            tails, heads = self._e_tail[idx], self._e_head[idx]
            fresh = heads[dist[heads] == -1]
            dist[fresh] = d + 1
            step = dist[heads] == d + 1
            cnt += np.bincount(heads[step], weights=cnt[tails[step]], minlength=self._n_sw)
            frontier = np.unique(fresh)
            d += 1
        dist.setflags(write=False)
        cnt.setflags(write=False)
        self._roots[r] = (dist, cnt)
        return dist, cnt

    def _rows(self, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stacked (dist, cnt) rows for the given roots, and the row of each root."""
        uniq, inv = np.unique(roots, return_inverse=True)
        dist = np.empty((len(uniq), self._n_sw), dtype=np.int64)
        cnt = np.empty((len(uniq), self._n_sw), dtype=np.float64)
        for i, r in enumerate(uniq):
            dist[i], cnt[i] = self._root(int(r))
        return dist, cnt, inv

    def _dag_edges(self, b: int) -> np.ndarray:
        """Directed switch-switch edges u->v with dist_b(u) = dist_b(v) + 1, sorted by tail."""
        hit = self._dag_cache.get(b)
        if hit is None:
            dist_b, _ = self._root(b)
            dt, dh = dist_b[self._e_tail], dist_b[self._e_head]
            edges = np.flatnonzero((dh >= 0) & (dt == dh + 1)).astype(np.int32)
            lay = dt[edges]
            order = np.argsort(lay, kind="stable")
            bounds = np.searchsorted(lay[order], np.arange(int(lay.max()) + 2 if lay.size else 1))
            # the layers index arrays in every dynamic programme: native-width indices (numpy
            # gathers with int32 ones many times slower), views of one array
            by_layer = edges[order].astype(np.intp)
            layers = [by_layer[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]
            hit = self._dag_cache[b] = (edges, layers)
        return hit[0]

    def _dag_layers(self, b: int) -> list[np.ndarray]:
        """_dag_edges(b) split by dist_b of the tail: layers[k] leave distance k."""
        self._dag_edges(b)
        return self._dag_cache[b][1]

    # ---- legs: the (access link, switch, switch, access link) combinations of a pair ------

    def _nic(self, name: str) -> int:
        try:
            return self.nic_index[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a NIC of topology {self.topology.name!r}") from None

    def _legs(self, s: int, d: int) -> tuple[int, list[tuple[int, int, int, int, float]]]:
        """(hops, legs) of a pair; a leg is (src access link, a, b, dst access link, weight).

        Direct NIC-NIC links give legs (link, -1, -1, -1, w) and hops 1. Unreachable: (-1, []).
        """
        if s == d:
            raise ValueError(f"source and destination are the same NIC {self.nic_names[s]!r}")
        direct = [lk for lk, other in self._direct[s] if other == d]
        if direct:
            return 1, [(lk, -1, -1, -1, 1.0 / len(direct)) for lk in direct]
        best = -1
        combos: list[tuple[int, int, int, int, float]] = []
        for lb, b in self._attach[d]:
            dist_b, cnt_b = self._root(b)
            for la, a in self._attach[s]:
                dd = int(dist_b[a])
                if dd < 0:
                    continue
                if best < 0 or dd < best:
                    best, combos = dd, []
                if dd == best:
                    combos.append((la, a, b, lb, float(cnt_b[a])))
        if best < 0:
            return -1, []
        total = sum(c[4] for c in combos)
        return best + 2, [(la, a, b, lb, c / total) for la, a, b, lb, c in combos]

    # ---- per pair -------------------------------------------------------------------------

    def hop_count(self, src: str, dst: str) -> int | None:
        hops, _ = self._legs(self._nic(src), self._nic(dst))
        return None if hops < 0 else hops

    def count_paths(self, src: str, dst: str) -> int:
        s, d = self._nic(src), self._nic(dst)
        hops, legs = self._legs(s, d)
        if hops < 0:
            return 0
        if hops == 1:
            return len(legs)
        return int(round(sum(float(self._root(b)[1][a]) for _, a, b, _, _ in legs)))

    def _switch_paths(self, a: int, b: int) -> tuple[tuple[int, ...], ...]:
        key = (a, b)
        hit = self._sw_paths.get(key)
        if hit is not None:
            self._sw_paths.move_to_end(key)
            return hit
        dist_b, _ = self._root(b)
        memo: dict[int, list[tuple[int, ...]]] = {b: [()]}

        def from_node(u: int) -> list[tuple[int, ...]]:
            if u in memo:
                return memo[u]
            out: list[tuple[int, ...]] = []
            for e in range(self._ptr[u], self._ptr[u + 1]):
                v = int(self._e_head[e])
                if dist_b[v] == dist_b[u] - 1:
                    lk = int(self._e_link[e])
                    out.extend((lk,) + rest for rest in from_node(v))
            memo[u] = out
            return out

        result = tuple(from_node(a))
        self._sw_paths[key] = result
        if len(self._sw_paths) > _PATH_CACHE_SIZE:
            self._sw_paths.popitem(last=False)
        return result

    def iter_paths(self, src: str, dst: str) -> Iterator[tuple[str, ...]]:
        s, d = self._nic(src), self._nic(dst)
        hops, legs = self._legs(s, d)
        ids = self.link_ids
        for la, a, b, lb, _ in legs:
            if a < 0:
                yield (ids[la],)
                continue
            for sp in self._switch_paths(a, b):
                yield (ids[la],) + tuple(ids[x] for x in sp) + (ids[lb],)

    def paths(self, src: str, dst: str, limit: int | None = None) -> list[tuple[str, ...]]:
        if limit is not None:
            n = self.count_paths(src, dst)
            if n > limit:
                raise TooManyPaths(f"{src} -> {dst} has {n} ECMP paths, more than the limit {limit}")
        return list(self.iter_paths(src, dst))

    def link_fractions(self, src: str, dst: str) -> dict[str, float]:
        inc = self.incidence([(src, dst)])
        pair, link, frac, _ = inc.coo()
        return {self.link_ids[int(k)]: float(f) for k, f in zip(link, frac, strict=True)}

    def switch_fractions(self, src: str, dst: str) -> dict[str, float]:
        inc = self.incidence([(src, dst)])
        fr = inc.switch_fractions(self.switch_names)[0]
        return {self.switch_names[i]: float(fr[i]) for i in np.flatnonzero(fr > 0)}

    def is_shortest_path(self, src: str, dst: str, path: Sequence[str]) -> bool:
        try:
            nodes = self.walk(src, path)
        except (ValueError, KeyError):
            return False
        return nodes[-1] == dst and len(path) == self.hop_count(src, dst)

    # ---- per path -------------------------------------------------------------------------

    def walk(self, src: str, path: Sequence[str]) -> tuple[str, ...]:
        """Nodes visited by `path` from NIC `src`: (src, switch, ..., last node)."""
        self._nic(src)
        nodes = [src]
        for i, lid in enumerate(path):
            k = self.link_index.get(lid)
            if k is None:
                raise ValueError(f"path[{i}]: {lid!r} is not a link of topology {self.topology.name!r}")
            here = nodes[-1]
            if i > 0 and here in self.nic_index:
                raise ValueError(f"path[{i}]: {lid!r} continues through NIC {here!r}; paths end at NICs")
            if self.link_a[k] == here:
                nodes.append(self.link_b[k])
            elif self.link_b[k] == here:
                nodes.append(self.link_a[k])
            else:
                raise ValueError(f"path[{i}]: link {lid!r} does not touch {here!r}")
        return tuple(nodes)

    def path_switches(self, src: str, path: Sequence[str]) -> tuple[str, ...]:
        return tuple(n for n in self.walk(src, path)[1:] if n in self.switch_index)

    @staticmethod
    def path_links(path: Sequence[str]) -> tuple[str, ...]:
        return tuple(path)

    @staticmethod
    def path_hops(path: Sequence[str]) -> int:
        return len(path)

    # ---- whole fabric ---------------------------------------------------------------------

    def connected(self) -> bool:
        """True when every NIC can reach every other NIC."""
        if len(self.nic_names) < 2:
            return True
        if any(not a for a in self._attach):
            # only direct NIC-NIC links: fine for a two-NIC fabric joined directly
            return len(self.nic_names) == 2 and bool(self._direct[0])
        dist, _ = self._root(self._attach[0][0][1])
        return all(any(dist[sw] >= 0 for _, sw in a) for a in self._attach)

    def incidence(
        self, pairs: Sequence[tuple[str, str]], paths: Sequence[Sequence[str] | None] | None = None
    ) -> Incidence:
        return Incidence(self, pairs, paths)


@dataclass
class _Known:
    pair: np.ndarray
    link: np.ndarray
    fwd: np.ndarray
    switch_pair: np.ndarray
    switch: np.ndarray


class Incidence:
    """Which of a set of NIC pairs can cross which link or switch, and with what fraction.

    Built by `PathIndex.incidence`; see the module docstring for the methods.
    """

    def __init__(
        self,
        index: PathIndex,
        pairs: Sequence[tuple[str, str]],
        paths: Sequence[Sequence[str] | None] | None = None,
    ):
        self.index = index
        self.pairs = tuple((str(s), str(d)) for s, d in pairs)
        n = len(self.pairs)
        if paths is not None and len(paths) != n:
            raise ValueError(f"paths has {len(paths)} entries for {n} pairs")
        src = np.array([index._nic(s) for s, _ in self.pairs], dtype=np.int64)
        dst = np.array([index._nic(d) for _, d in self.pairs], dtype=np.int64)
        if np.any(src == dst):
            i = int(np.flatnonzero(src == dst)[0])
            raise ValueError(f"pairs[{i}]: source and destination are the same NIC {self.pairs[i][0]!r}")
        self.src, self.dst = src, dst
        known = np.zeros(n, dtype=bool)
        if paths is not None:
            known = np.array([p is not None for p in paths], dtype=bool)
        self.known = known
        self.hops = np.full(n, -1, dtype=np.int64)
        self.npaths = np.zeros(n, dtype=np.float64)

        # known paths: explicit rows, walked for all pairs at once
        kp, kl, kf, ksp, ks = (np.zeros(0, dtype=np.int64),) * 5
        if paths is not None and known.any():
            kp, kl, kf, ksp, ks = self._walk_known(np.flatnonzero(known), paths)
            self.npaths[known] = 1.0
        self._known = _Known(kp, kl, kf.astype(bool), ksp, ks)

        # ECMP pairs: legs. Fast path for single-homed NICs; general path otherwise.
        ecmp = np.flatnonzero(~known)
        a = index.nic_switch[src[ecmp]]
        b = index.nic_switch[dst[ecmp]]
        fast = (a >= 0) & (b >= 0)
        lp = [ecmp[fast]]
        la = [index.nic_access[src[ecmp[fast]]]]
        lb = [index.nic_access[dst[ecmp[fast]]]]
        lsa = [a[fast]]
        lsb = [b[fast]]
        lw = [np.ones(int(fast.sum()))]
        slow_p, slow_la, slow_a, slow_b, slow_lb, slow_w = [], [], [], [], [], []
        for i in ecmp[~fast]:
            hops, legs = index._legs(int(src[i]), int(dst[i]))
            self.hops[i] = hops
            for leg in legs:
                slow_p.append(i)
                slow_la.append(leg[0])
                slow_a.append(leg[1])
                slow_b.append(leg[2])
                slow_lb.append(leg[3])
                slow_w.append(leg[4])
        lp.append(np.array(slow_p, dtype=np.int64))
        la.append(np.array(slow_la, dtype=np.int64))
        lsa.append(np.array(slow_a, dtype=np.int64))
        lsb.append(np.array(slow_b, dtype=np.int64))
        lb.append(np.array(slow_lb, dtype=np.int64))
        lw.append(np.array(slow_w, dtype=np.float64))
        self.leg_pair = np.concatenate(lp)
        self.leg_la = np.concatenate(la)
        self.leg_a = np.concatenate(lsa)
        self.leg_b = np.concatenate(lsb)
        self.leg_lb = np.concatenate(lb)
        self.leg_w = np.concatenate(lw)
        self.leg_direct = self.leg_a < 0

        # distances and counts of switched legs, from the root rows
        sw = ~self.leg_direct
        roots = np.concatenate((self.leg_a[sw], self.leg_b[sw]))
        if roots.size:
            self._dist, self._cnt, inv = index._rows(roots)
            m = int(sw.sum())
            self._ra = np.full(len(self.leg_pair), -1, dtype=np.int64)
            self._rb = np.full(len(self.leg_pair), -1, dtype=np.int64)
            self._ra[sw], self._rb[sw] = inv[:m], inv[m:]
        else:
            self._dist = np.zeros((0, index._n_sw), dtype=np.int64)
            self._cnt = np.zeros((0, index._n_sw))
            self._ra = np.full(len(self.leg_pair), -1, dtype=np.int64)
            self._rb = np.full(len(self.leg_pair), -1, dtype=np.int64)
        self.leg_d = np.full(len(self.leg_pair), -1, dtype=np.int64)  # switch hops a..b
        self.leg_n = np.ones(len(self.leg_pair), dtype=np.float64)  # switch paths a..b
        if sw.any():
            self.leg_d[sw] = self._dist[self._rb[sw], self.leg_a[sw]]
            self.leg_n[sw] = self._cnt[self._rb[sw], self.leg_a[sw]]
        # unreachable fast-path legs: drop them
        ok = self.leg_direct | (self.leg_d >= 0)
        if not ok.all():
            for name in ("leg_pair", "leg_la", "leg_a", "leg_b", "leg_lb", "leg_w", "leg_direct",
                         "_ra", "_rb", "leg_d", "leg_n"):
                setattr(self, name, getattr(self, name)[ok])
        self.hops[self.leg_pair] = np.where(self.leg_direct, 1, self.leg_d + 2)
        direct_count = np.bincount(self.leg_pair[self.leg_direct], minlength=n)
        self.npaths[~known] = 0.0
        sw_n = np.bincount(self.leg_pair[~self.leg_direct], weights=self.leg_n[~self.leg_direct], minlength=n)
        self.npaths[~known] = (sw_n + direct_count)[~known]
        self.reachable = self.hops >= 0
        self._dag_list: list | None = None
        self._flow: list | None = None

    def _walk_known(self, rows: np.ndarray, paths: Sequence[Sequence[str] | None]):
        """Validate and expand known paths: (pair, link, forward, switch_pair, switch) arrays."""
        idx = self.index
        n_sw = idx._n_sw
        lengths = np.array([len(paths[i]) for i in rows], dtype=np.int64)
        li = idx.link_index
        flat = [li.get(lid, -1) for i in rows for lid in paths[i]]
        links = np.array(flat, dtype=np.int64)

        def fail(r: int) -> None:
            i = int(rows[r])
            try:
                nodes = idx.walk(self.pairs[i][0], paths[i])
            except ValueError as exc:
                raise ValueError(f"paths[{i}]: {exc}") from None
            raise ValueError(f"paths[{i}]: ends at {nodes[-1]!r}, not at the destination {self.pairs[i][1]!r}")

        if np.any(links < 0):
            fail(int(np.repeat(np.arange(len(rows)), lengths)[np.flatnonzero(links < 0)[0]]))
        if np.any(lengths == 0):
            fail(int(np.flatnonzero(lengths == 0)[0]))
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        cur = self.src[rows] + n_sw
        fwd = np.zeros(len(links), dtype=bool)
        visited_pair: list[np.ndarray] = []
        visited_sw: list[np.ndarray] = []
        for j in range(int(lengths.max())):
            act = np.flatnonzero(lengths > j)
            k = links[starts[act] + j]
            a, b = idx.link_node_a[k], idx.link_node_b[k]
            here = cur[act]
            is_a, is_b = a == here, b == here
            bad = ~(is_a | is_b) | ((j > 0) & (here >= n_sw))
            if bad.any():
                fail(int(act[np.flatnonzero(bad)[0]]))
            fwd[starts[act] + j] = is_a
            nxt = np.where(is_a, b, a)
            cur[act] = nxt
            inner = (lengths[act] > j + 1)
            visited_pair.append(rows[act[inner]])
            visited_sw.append(nxt[inner])
        wrong = np.flatnonzero(cur != self.dst[rows] + n_sw)
        if wrong.size:
            fail(int(wrong[0]))
        self.hops[rows] = lengths
        sw_pair = np.concatenate(visited_pair)
        sw = np.concatenate(visited_sw)
        order = np.argsort(sw_pair, kind="stable")
        return np.repeat(rows, lengths), links, fwd, sw_pair[order], sw[order]

    def __len__(self) -> int:
        return len(self.pairs)

    # ---- helpers --------------------------------------------------------------------------

    def _links(self, link_ids: Iterable[str]) -> np.ndarray:
        out = []
        for lid in link_ids:
            k = self.index.link_index.get(lid)
            if k is None:
                raise KeyError(f"{lid!r} is not a link of topology {self.index.topology.name!r}")
            out.append(k)
        return np.array(out, dtype=np.int64)

    def _switches(self, names: Iterable[str]) -> np.ndarray:
        out = []
        for name in names:
            k = self.index.switch_index.get(name)
            if k is None:
                raise KeyError(f"{name!r} is not a switch of topology {self.index.topology.name!r}")
            out.append(k)
        return np.array(out, dtype=np.int64)

    def _leg_edge_frac(self, x: int, y: int) -> np.ndarray:
        """Per switched leg: fraction of its switch paths crossing x->y (x, y switches)."""
        sw = ~self.leg_direct
        out = np.zeros(len(self.leg_pair))
        if not sw.any():
            return out
        ra, rb, d = self._ra[sw], self._rb[sw], self.leg_d[sw]
        on = (self._dist[ra, x] >= 0) & (self._dist[ra, x] + 1 + self._dist[rb, y] == d)
        out[sw] = np.where(on, self._cnt[ra, x] * self._cnt[rb, y] / self.leg_n[sw], 0.0)
        return out

    # ---- fractions ------------------------------------------------------------------------

    def link_fractions(self, link_ids: Sequence[str], directed: bool = False):
        """[pairs x K] fraction of each pair's probes crossing each link.

        With directed=True, a tuple (a->b, b->a) of such arrays, a and b being the link's ends
        as written in the topology.
        """
        ks = self._links(link_ids)
        n = len(self.pairs)
        fwd = np.zeros((n, len(ks)))
        rev = np.zeros((n, len(ks)))
        idx = self.index
        for j, k in enumerate(ks):
            kind = idx.link_kind[k]
            if kind == 0:
                x, y = int(idx.link_switch_a[k]), int(idx.link_switch_b[k])
                f = self._leg_edge_frac(x, y) * self.leg_w
                r = self._leg_edge_frac(y, x) * self.leg_w
            else:
                # access link (or direct NIC-NIC link): on the leg when it is la or lb
                on_src = (self.leg_la == k) * self.leg_w
                on_dst = (self.leg_lb == k) * self.leg_w
                a_is_nic = idx.link_switch_a[k] < 0
                if kind == 2:
                    src_is_a = np.array(
                        [idx.nic_index[idx.link_a[k]] == s for s in self.src[self.leg_pair]], dtype=bool
                    ) if len(self.leg_pair) else np.zeros(0, dtype=bool)
                    f = on_src * src_is_a
                    r = on_src * ~src_is_a
                elif a_is_nic:
                    f, r = on_src, on_dst  # NIC -> switch is a -> b
                else:
                    f, r = on_dst, on_src
            fwd[:, j] = np.bincount(self.leg_pair, weights=f, minlength=n)
            rev[:, j] = np.bincount(self.leg_pair, weights=r, minlength=n)
        kn = self._known
        if kn.pair.size and len(ks):
            col = {int(k): j for j, k in enumerate(ks)}
            for p, lk, fw in zip(kn.pair, kn.link, kn.fwd, strict=True):
                j = col.get(int(lk))
                if j is not None:
                    (fwd if fw else rev)[p, j] += 1.0
        if directed:
            return fwd, rev
        return fwd + rev

    def switch_fractions(self, names: Sequence[str]) -> np.ndarray:
        """[pairs x K] fraction of each pair's probes crossing each switch."""
        ks = self._switches(names)
        n = len(self.pairs)
        out = np.zeros((n, len(ks)))
        sw = ~self.leg_direct
        ra, rb, d = self._ra[sw], self._rb[sw], self.leg_d[sw]
        lp, lw, ln = self.leg_pair[sw], self.leg_w[sw], self.leg_n[sw]
        for j, s in enumerate(ks):
            da, db = self._dist[ra, s], self._dist[rb, s]
            on = (da >= 0) & (db >= 0) & (da + db == d)
            f = np.where(on, self._cnt[ra, s] * self._cnt[rb, s] / ln, 0.0) * lw
            out[:, j] = np.bincount(lp, weights=f, minlength=n)
        kn = self._known
        if kn.switch.size and len(ks):
            col = {int(k): j for j, k in enumerate(ks)}
            for p, s in zip(kn.switch_pair, kn.switch, strict=True):
                j = col.get(int(s))
                if j is not None:
                    out[p, j] += 1.0
        return out

    def fraction_entries(
        self, links: np.ndarray, forward: np.ndarray, switches: np.ndarray, chunk: int = 64,
        pairs: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sparse fractions of many elements at once, as (pair, column, fraction) entries.

        Columns 0..len(links)-1: link links[j] (indices into PathIndex.link_ids) crossed a->b
        when forward[j], b->a otherwise; then one column per switch in `switches`. Entries of the
        same (pair, column) may repeat (pairs with several legs): sum them. Vectorized over the
        elements, so K elements cost about as much as a few calls of link_fractions. pairs: an
        optional boolean mask; only those pairs' entries are computed.
        """
        idx = self.index
        links = np.asarray(links, dtype=np.int64)
        forward = np.asarray(forward, dtype=bool)
        switches = np.asarray(switches, dtype=np.int64)
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        keep = np.ones(len(self.pairs), dtype=bool) if pairs is None else np.asarray(pairs, dtype=bool)
        sw = np.flatnonzero(~self.leg_direct & keep[self.leg_pair])
        ra, rb, d = self._ra[sw], self._rb[sw], self.leg_d[sw]
        base = self.leg_w[sw] / self.leg_n[sw]
        lp = self.leg_pair[sw]

        # [legs x chunk] distances gathered row by row from the few root rows (far faster than
        # one two-dimensional gather); path counts only where the element is on a path
        kind = idx.link_kind[links] if links.size else np.zeros(0, dtype=np.int8)
        inner = np.flatnonzero(kind == 0)
        for start in range(0, len(inner), chunk):
            j = inner[start:start + chunk]
            k = links[j]
            x = np.where(forward[j], idx.link_switch_a[k], idx.link_switch_b[k])
            y = np.where(forward[j], idx.link_switch_b[k], idx.link_switch_a[k])
            dx, dy = self._dist[:, x][ra], self._dist[:, y][rb]
            on = (dx >= 0) & (dy >= 0) & (dx + 1 + dy == d[:, None])
            r, c = np.nonzero(on)
            rows.append(lp[r])
            cols.append(j[c])
            vals.append(self._cnt[ra[r], x[c]] * self._cnt[rb[r], y[c]] * base[r])
        for j in np.flatnonzero(kind != 0):
            k = int(links[j])
            on_src = self.leg_la == k
            on_dst = self.leg_lb == k
            if kind[j] == 2:
                a_nic = idx.nic_index[idx.link_a[k]]
                src_is_a = self.src[self.leg_pair] == a_nic
                hit = on_src & (src_is_a == bool(forward[j]))
            elif idx.link_switch_a[k] < 0:  # a is the NIC: a -> b leaves the NIC (source side)
                hit = on_src if forward[j] else on_dst
            else:
                hit = on_dst if forward[j] else on_src
            r = np.flatnonzero(hit & keep[self.leg_pair])
            rows.append(self.leg_pair[r])
            cols.append(np.full(len(r), j, dtype=np.int64))
            vals.append(self.leg_w[r])
        for start in range(0, len(switches), chunk):
            s = switches[start:start + chunk]
            da, db = self._dist[:, s][ra], self._dist[:, s][rb]
            on = (da >= 0) & (db >= 0) & (da + db == d[:, None])
            r, c = np.nonzero(on)
            rows.append(lp[r])
            cols.append(c + len(links) + start)
            vals.append(self._cnt[ra[r], s[c]] * self._cnt[rb[r], s[c]] * base[r])
        kn = self._known
        if kn.pair.size:
            if links.size:
                key = {(int(k), bool(f)): j for j, (k, f) in enumerate(zip(links, forward, strict=True))}
                hit = [(p, key[(int(k), bool(f))]) for p, k, f in zip(kn.pair, kn.link, kn.fwd, strict=True)
                       if (int(k), bool(f)) in key and keep[p]]
                if hit:
                    rows.append(np.array([h[0] for h in hit], dtype=np.int64))
                    cols.append(np.array([h[1] for h in hit], dtype=np.int64))
                    vals.append(np.ones(len(hit)))
            if switches.size and kn.switch.size:
                col = {int(s): len(links) + j for j, s in enumerate(switches)}
                hit = [(p, col[int(s)]) for p, s in zip(kn.switch_pair, kn.switch, strict=True)
                       if int(s) in col and keep[p]]
                if hit:
                    rows.append(np.array([h[0] for h in hit], dtype=np.int64))
                    cols.append(np.array([h[1] for h in hit], dtype=np.int64))
                    vals.append(np.ones(len(hit)))
        if not rows:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0)
        return (np.concatenate(rows).astype(np.int64), np.concatenate(cols).astype(np.int64),
                np.concatenate(vals).astype(np.float64))

    def nic_counts(self, names: Sequence[str]) -> np.ndarray:
        """[pairs x K] how many ends of each pair are each NIC (0 or 1)."""
        ks = np.array([self.index._nic(nm) for nm in names], dtype=np.int64)
        return ((self.src[:, None] == ks[None, :]).astype(np.float64)
                + (self.dst[:, None] == ks[None, :]))

    def host_counts(self, names: Sequence[str]) -> np.ndarray:
        """[pairs x K] how many ends of each pair are on each host (0, 1 or 2)."""
        hi = self.index.host_index
        missing = [nm for nm in names if nm not in hi]
        if missing:
            raise KeyError(f"{missing[0]!r} is not a host of topology {self.index.topology.name!r}")
        ks = np.array([hi[nm] for nm in names], dtype=np.int64)
        hs, hd = self.index.nic_host[self.src], self.index.nic_host[self.dst]
        return (hs[:, None] == ks[None, :]).astype(np.float64) + (hd[:, None] == ks[None, :])

    def pairs_through(self, link_id: str) -> tuple[np.ndarray, np.ndarray]:
        f = self.link_fractions([link_id])[:, 0]
        idx = np.flatnonzero(f > 0)
        return idx, f[idx]

    # ---- loads and products over all elements (per-destination dynamic programmes) -------

    def _dags(self) -> list[tuple[int, np.ndarray, list[np.ndarray], np.ndarray]]:
        """(root b, cnt_b, layers, legs) for each destination root of switched legs, computed
        once per Incidence.

        layers[k] = indices of directed edges u->v with dist_b(u) = k, dist_b(v) = k - 1;
        legs = the switched legs ending at b.
        """
        if self._dag_list is None:
            idx = self.index
            sw = np.flatnonzero(~self.leg_direct)
            order = sw[np.argsort(self.leg_b[sw], kind="stable")]
            bs = self.leg_b[order]
            cuts = np.flatnonzero(np.diff(bs)) + 1
            out = []
            for legs in np.split(order, cuts) if order.size else []:
                b = int(self.leg_b[legs[0]])
                out.append((b, idx._root(b)[1], idx._dag_layers(b), legs))
            self._dag_list = out
        return self._dag_list

    def _flow_steps(self) -> list[tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]]:
        """Per destination root of switched legs: (cnt_b, legs, steps), steps the layers of its
        DAG from the farthest in, each as (edges, tails, heads) restricted to the edges whose
        tail a leg of this Incidence can reach (the others never carry flow: on a three-tier
        fabric about half of them). Computed once per Incidence."""
        if self._flow is None:
            idx = self.index
            out = []
            for _b, cnt_b, layers, legs in self._dags():
                reach = np.zeros(idx._n_sw, dtype=bool)
                reach[self.leg_a[legs]] = True
                steps = []
                for k in range(len(layers) - 1, 0, -1):
                    e = layers[k]
                    e = e[reach[idx._e_tail[e]]]
                    if e.size == 0:
                        continue
                    h = idx._e_head[e]
                    reach[h] = True
                    steps.append((e, idx._e_tail[e], h))
                out.append((cnt_b, legs, steps))
            self._flow = out
        return self._flow

    def loads(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(link a->b, link b->a, switch) loads: per element, sum over pairs of weight x fraction.

        weights: one number per pair (default 1), or a [pairs x m] array for m sets of weights at
        once (the results then have a trailing axis of m).
        """
        idx = self.index
        n_links, n_sw = len(idx.link_ids), idx._n_sw
        w = np.ones(len(self.pairs)) if weights is None else np.asarray(weights, dtype=np.float64)
        squeeze = w.ndim == 1
        w2 = w[:, None] if squeeze else w
        m_cols = w2.shape[1]
        fwd = np.zeros((n_links, m_cols))
        rev = np.zeros((n_links, m_cols))
        sw_load = np.zeros((n_sw, m_cols))
        # access / direct links
        for lk_arr, at_src in ((self.leg_la, True), (self.leg_lb, False)):
            m = lk_arr >= 0
            lk = lk_arr[m]
            a_is_nic = idx.link_switch_a[lk] < 0
            if at_src:
                is_fwd = a_is_nic.copy()
                direct = idx.link_kind[lk] == 2
                if direct.any():
                    srcs = self.src[self.leg_pair[m]][direct]
                    a_nic = np.array([idx.nic_index[idx.link_a[k]] for k in lk[direct]], dtype=np.int64)
                    is_fwd[direct] = a_nic == srcs
            else:
                is_fwd = ~a_is_nic
            for c in range(m_cols):
                lw = (self.leg_w * w2[self.leg_pair, c])[m]
                fwd[:, c] += np.bincount(lk[is_fwd], weights=lw[is_fwd], minlength=n_links)
                rev[:, c] += np.bincount(lk[~is_fwd], weights=lw[~is_fwd], minlength=n_links)
        # switch-switch links and switches: flow DP per destination root, one weight column at a
        # time (one-dimensional gathers and bincounts are the fastest numpy has here)
        edge_load = np.zeros((m_cols, len(idx._e_link)))
        for cnt_b, legs, steps in self._flow_steps():
            base = self.leg_w[legs] / self.leg_n[legs]
            leg_a = self.leg_a[legs]
            for c in range(m_cols):
                lw = base * w2[self.leg_pair[legs], c]
                if not lw.any():  # nothing flows to this root: it adds only zeros
                    continue
                flow = np.bincount(leg_a, weights=lw, minlength=n_sw)
                load = edge_load[c]
                for e, t, h in steps:
                    ft = flow[t]
                    load[e] += ft * cnt_b[h]
                    flow += np.bincount(h, weights=ft, minlength=n_sw)
                sw_load[:, c] += flow * cnt_b
        ef = idx._e_fwd
        kn = self._known
        for c in range(m_cols):
            fwd[:, c] += np.bincount(idx._e_link[ef], weights=edge_load[c][ef], minlength=n_links)
            rev[:, c] += np.bincount(idx._e_link[~ef], weights=edge_load[c][~ef], minlength=n_links)
            if kn.pair.size:
                kw = w2[kn.pair, c]
                fwd[:, c] += np.bincount(kn.link[kn.fwd], weights=kw[kn.fwd], minlength=n_links)
                rev[:, c] += np.bincount(kn.link[~kn.fwd], weights=kw[~kn.fwd], minlength=n_links)
            if kn.switch.size:
                sw_load[:, c] += np.bincount(kn.switch, weights=w2[kn.switch_pair, c], minlength=n_sw)
        if squeeze:
            return fwd[:, 0], rev[:, 0], sw_load[:, 0]
        return fwd, rev, sw_load

    def link_loads(self, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per link (PathIndex.link_ids order): sum over pairs of weight x fraction, (a->b, b->a)."""
        fwd, rev, _ = self.loads(weights)
        return fwd, rev

    def switch_loads(self, weights: np.ndarray | None = None) -> np.ndarray:
        """Per switch (PathIndex.switch_names order): sum over pairs of weight x fraction."""
        return self.loads(weights)[2]

    def mean_path_product(
        self,
        link_fwd: np.ndarray,
        link_rev: np.ndarray | None = None,
        switch: np.ndarray | None = None,
    ) -> np.ndarray:
        """Per pair: mean over its ECMP paths (or its known path) of the product of factors.

        link_fwd[k] / link_rev[k]: factor of link k crossed a->b / b->a (link_rev defaults to
        link_fwd); switch[s]: factor of switch s (default 1). With survival probabilities as
        factors, this is the exact delivery probability of a probe under even ECMP spreading.
        """
        idx = self.index
        link_fwd = np.asarray(link_fwd, dtype=np.float64)
        link_rev = link_fwd if link_rev is None else np.asarray(link_rev, dtype=np.float64)
        n_sw = idx._n_sw
        sw_f = np.ones(n_sw) if switch is None else np.asarray(switch, dtype=np.float64)
        n = len(self.pairs)
        leg_val = np.zeros(len(self.leg_pair))
        e_factor = np.where(idx._e_fwd, link_fwd[idx._e_link], link_rev[idx._e_link])
        swl = ~self.leg_direct
        for b, cnt_b, layers, legs in self._dags():
            val = np.zeros(n_sw)
            val[b] = sw_f[b]
            need = int(self.leg_d[legs].max())
            for k in range(1, min(need, len(layers) - 1) + 1):
                e = layers[k]
                if e.size == 0:
                    continue
                t, h = idx._e_tail[e], idx._e_head[e]
                acc = np.bincount(t, weights=e_factor[e] * val[h], minlength=n_sw)
                nodes = np.unique(t)
                val[nodes] = sw_f[nodes] * acc[nodes]
            leg_val[legs] = val[self.leg_a[legs]] / cnt_b[self.leg_a[legs]]
        # access links: src side crossed NIC->switch, dst side switch->NIC
        m = swl
        la, lb = self.leg_la[m], self.leg_lb[m]
        a_nic_la = idx.link_switch_a[la] < 0
        a_nic_lb = idx.link_switch_a[lb] < 0
        leg_val[m] *= np.where(a_nic_la, link_fwd[la], link_rev[la])
        leg_val[m] *= np.where(a_nic_lb, link_rev[lb], link_fwd[lb])
        if self.leg_direct.any():
            dl = np.flatnonzero(self.leg_direct)
            for i in dl:
                k = int(self.leg_la[i])
                src_is_a = idx.nic_index[idx.link_a[k]] == self.src[self.leg_pair[i]]
                leg_val[i] = link_fwd[k] if src_is_a else link_rev[k]
        out = np.bincount(self.leg_pair, weights=leg_val * self.leg_w, minlength=n).astype(np.float64)
        kn = self._known
        if kn.pair.size:
            known_val = np.ones(n)
            f = np.where(kn.fwd, link_fwd[kn.link], link_rev[kn.link])
            np.multiply.at(known_val, kn.pair, f)
            if kn.switch.size:
                np.multiply.at(known_val, kn.switch_pair, sw_f[kn.switch])
            out[self.known] = known_val[self.known]
        return out

    # ---- paths ----------------------------------------------------------------------------

    def sample_paths(self, rng: np.random.Generator) -> list[tuple[str, ...] | None]:
        """One path per pair: the known path, or an ECMP path drawn uniformly (None: unreachable)."""
        idx = self.index
        n = len(self.pairs)
        out: list[tuple[str, ...] | None] = [None] * n
        kn = self._known
        if kn.pair.size:  # rows are in pair order, each path's links in path order
            cut = np.flatnonzero(np.diff(kn.pair)) + 1
            for rows in np.split(np.arange(len(kn.pair)), cut):
                out[int(kn.pair[rows[0]])] = tuple(idx.link_ids[k] for k in kn.link[rows])
        ecmp = np.flatnonzero(~self.known & self.reachable)
        if ecmp.size == 0:
            return out
        # choose a leg per pair (weights = share of paths)
        order = np.argsort(self.leg_pair, kind="stable")
        lp = self.leg_pair[order]
        cw = self.leg_w[order]
        starts = np.searchsorted(lp, ecmp)
        ends = np.searchsorted(lp, ecmp, side="right")
        u = rng.random(len(ecmp))
        chosen = np.empty(len(ecmp), dtype=np.int64)
        single = ends - starts == 1
        chosen[single] = order[starts[single]]
        for j in np.flatnonzero(~single):
            seg = slice(starts[j], ends[j])
            c = np.cumsum(cw[seg])
            chosen[j] = order[starts[j] + min(int(np.searchsorted(c, u[j] * c[-1], side="right")),
                                              ends[j] - starts[j] - 1)]
        legs = chosen
        sw = ~self.leg_direct[legs]
        max_d = int(self.leg_d[legs][sw].max()) if sw.any() else 0
        mid = np.full((len(legs), max_d), -1, dtype=np.int64)
        lb_of = self.leg_b[legs]
        for b in np.unique(lb_of[sw]):
            walkers = np.flatnonzero(sw & (lb_of == b))
            _, cnt_b = idx._root(int(b))
            edges = idx._dag_edges(int(b))  # sorted by tail
            tails = idx._e_tail[edges]
            cum = np.cumsum(cnt_b[idx._e_head[edges]])
            cur = self.leg_a[legs[walkers]].copy()
            for step in range(max_d):
                act = np.flatnonzero(cur != b)
                if act.size == 0:
                    break
                u = cur[act]
                lo = np.searchsorted(tails, u, side="left")
                hi = np.searchsorted(tails, u, side="right")
                before = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0.0)
                thr = before + (1.0 - rng.random(len(act))) * (cum[hi - 1] - before)
                pick = np.minimum(np.searchsorted(cum, thr, side="left"), hi - 1)
                e = edges[pick]
                mid[walkers[act], step] = idx._e_link[e]
                cur[act] = idx._e_head[e]
        ids = np.array(idx.link_ids, dtype=object)
        la, lb = self.leg_la[legs], self.leg_lb[legs]
        d_of = np.where(sw, self.leg_d[legs], -1)
        for d in np.unique(d_of):
            rows = np.flatnonzero(d_of == d)
            if d < 0:  # direct NIC-NIC link
                full = la[rows][:, None]
            else:
                full = np.concatenate((la[rows][:, None], mid[rows, :d], lb[rows][:, None]), axis=1)
            for p, path in zip(ecmp[rows].tolist(), ids[full].tolist(), strict=True):
                out[p] = tuple(path)
        return out

    def coo(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Explicit (pair, link, fraction, forward) rows. Size grows with pairs x path width."""
        idx = self.index
        rows_p: list[np.ndarray] = []
        rows_l: list[np.ndarray] = []
        rows_f: list[np.ndarray] = []
        rows_d: list[np.ndarray] = []
        # access and direct links
        for lk_arr, at_src in ((self.leg_la, True), (self.leg_lb, False)):
            m = lk_arr >= 0
            lk = lk_arr[m]
            a_is_nic = idx.link_switch_a[lk] < 0
            if at_src:
                is_fwd = a_is_nic.copy()
                direct = idx.link_kind[lk] == 2
                if direct.any():
                    srcs = self.src[self.leg_pair[m]][direct]
                    is_fwd[direct] = np.array(
                        [idx.nic_index[idx.link_a[k]] for k in lk[direct]], dtype=np.int64) == srcs
            else:
                is_fwd = ~a_is_nic
            rows_p.append(self.leg_pair[m])
            rows_l.append(lk)
            rows_f.append(self.leg_w[m])
            rows_d.append(is_fwd)
        # switch-switch links: per switched leg, edges on its DAG
        swl = np.flatnonzero(~self.leg_direct & (self.leg_d > 0))
        et, eh = idx._e_tail, idx._e_head
        for i in swl:
            ra, rb, d = self._ra[i], self._rb[i], self.leg_d[i]
            da, db = self._dist[ra], self._dist[rb]
            on = (da[et] >= 0) & (db[eh] >= 0) & (da[et] + 1 + db[eh] == d)
            e = np.flatnonzero(on)
            rows_p.append(np.full(len(e), self.leg_pair[i]))
            rows_l.append(idx._e_link[e])
            rows_f.append(self._cnt[ra, et[e]] * self._cnt[rb, eh[e]] / self.leg_n[i] * self.leg_w[i])
            rows_d.append(idx._e_fwd[e])
        kn = self._known
        rows_p.append(kn.pair)
        rows_l.append(kn.link)
        rows_f.append(np.ones(len(kn.pair)))
        rows_d.append(kn.fwd)
        p = np.concatenate(rows_p).astype(np.int64)
        lk = np.concatenate(rows_l).astype(np.int64)
        f = np.concatenate(rows_f).astype(np.float64)
        dr = np.concatenate(rows_d).astype(bool)
        # merge duplicates (multi-leg pairs sharing a link)
        if p.size:
            key = (p * len(idx.link_ids) + lk) * 2 + dr
            uniq, inv = np.unique(key, return_inverse=True)
            f = np.bincount(inv, weights=f)
            dr = (uniq % 2).astype(bool)
            lk = (uniq // 2) % len(idx.link_ids)
            p = (uniq // 2) // len(idx.link_ids)
        return p, lk, f, dr
