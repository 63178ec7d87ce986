"""Fault localization of one window: three channels, one sparse search each, one verdict.

Channels (each a `glm.SparseGLM` over the elements of `fabric.FabricModel`):

1. **loss**: lost_i ~ Poisson(sent_i * mu_i) with
   mu_i = b1 * hops_i + b0 + sum_e x[i, e] r_e: background per link crossed and per pair, plus a
   loss rate r_e per faulty element, x the share of the pair's probes crossing e (even ECMP
   spreading, or 1 on a known path). Exact for one faulty element per pair; overlaps add. The
   background is capped (a third of the reporting floor): loss every pair shares beyond that
   is a fault of what they share. Contaminated by bursts: with prior probability
   `burst_prior` a pair loses a few probes in one burst tied to no element (geometric sizes),
   so a handful of bursty pairs does not make an element (`glm.PoissonBurst`).
2. **median delay** (noisy-OR): a pair is anomalous when its p50 exceeds the healthy p50 of its
   hop count by more than `delay_z` robust standard deviations (1.4826 MAD over the window's
   pairs) and by `delay_rel` of the healthy value. An element with activation a and coverage
   threshold tau makes each pair with x[i, e] >= tau anomalous with probability a; a pair is
   normal only if no element (nor the background rate) makes it anomalous. A median moves only
   when most of a pair's probes are delayed: tau >= 1/2 here.
3. **tail delay** (noisy-OR): the same on p99, every tau of `coverage` (a delay on 1/32 of a
   pair's paths shows in its p99). End hosts with a noisy tail are common: NIC and host columns
   pay a prior price from `noisy_end_prior`, and are never culprits in this channel.

Columns: every element direction alone, and every element in both directions at once (one
penalty for a cable or NIC that fails both ways). Candidate pools: every element's excess
(observed minus expected losses or anomalies, weighted by x) comes from one adjoint pass over all
elements per round (`Prepared.adjoint`, the ECMP dynamic programme of workers.fabric.paths);
the top elements of each kind by excess and by excess / sqrt(expected), and the strongest links
of the switches that stand out, form the pool, whose columns are built explicitly; the search
runs in the pool (forward selection with refit, backward pruning, penalty log(#elements) +
log(N)/2 nats); the residual is screened again and the pool grown until nothing new changes the
model. Aggregates are weighed against their parts both ways (a switch against the elements
around it; several links of one switch, NICs of one host, links of a multi-homed NIC against
that switch, host or NIC), and elements one channel found get a small penalty in the others
(a link known to lose probes explains the tail anomalies around it better than a switch).

Reporting (formats/fabric.md): an active element is a culprit when it pays its penalty, is
backed by at least `min_support` positive pairs it explains for the most part, and is large
enough to matter (loss rate >= max(`loss_floor`, `bg_multiple` x the background per link);
delay activation >= `min_activation`). Link directions report as the link, NIC and host
directions as the NIC and host; a host all of whose NICs are culprits is the host; a switch all
of whose links (or NICs) are culprits is the switch; NICs of a culprit host fold into it.

Confidence of a culprit = P(it is the element | single swaps with every pool candidate or none,
prior odds exp(-penalty), alternatives naming the same culprit added up) x P(its rate is above
the reporting floor), from the channel's likelihood; combined over channels as 1 - prod(1 - c).
Culprits below `min_confidence` are left out (for F1, naming a culprit of confidence p pays when
p > F1 / 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from workers.triangulation.fabric import (
    KIND_HOST,
    KIND_LINK,
    KIND_NIC,
    KIND_SWITCH,
    Columns,
    FabricModel,
    Prepared,
)
from workers.triangulation.glm import NoisyOr, Poisson, PoissonBurst, SparseGLM

VERDICT_FORMAT = "lockstep.verdict/v1"
# tie-break between elements the probes cannot tell apart: the spec names a host whose every
# NIC misbehaves as the host, otherwise the smallest element
_RANK = {KIND_HOST: 0, KIND_NIC: 1, KIND_LINK: 2, KIND_SWITCH: 3}


@dataclass(frozen=True)
class Settings:
    loss_floor: float = 0.003  # smallest loss rate of an element reported as a fault
    bg_multiple: float = 3.0  # ... and at least this many times the background per link
    delay_z: float = 3.5  # robust z above the healthy percentile for an anomalous pair
    delay_rel: float = 0.3  # ... and at least this fraction of the healthy percentile
    min_delivered: int = 5  # delay percentiles of pairs with fewer delivered probes are unused
    min_activation: float = 0.3  # delay: smallest share of covered pairs made anomalous
    min_support: int = 2  # positive pairs an element must explain for the most part
    pool_fabric: int = 32  # candidates per kind and ranking taken into the pool
    pool_edge: int = 256  # NIC and host directions that stand out, at most (by z)
    rescreen_rounds: int = 3
    coverage: tuple[float, ...] = (1.0, 0.5, 0.2, 0.05, 0.0)  # delay coverage thresholds tau
    burst_prior: float = 0.005  # prior probability that a pair loses probes in a burst tied to no element
    burst_q: float = 0.5  # burst sizes: geometric, mean 1 / (1 - q) probes
    noisy_end_prior: float = 0.05  # prior probability that a NIC or host has a noisy delay tail
    min_confidence: float = 0.45  # culprits below are left out of the verdict


@dataclass(frozen=True)
class Culprit:
    kind: str
    name: str
    confidence: float
    evidence: dict = field(default_factory=dict, compare=False)

    def to_document(self, evidence: bool = False) -> dict:
        doc = {"kind": self.kind, "name": self.name, "confidence": round(self.confidence, 4)}
        if evidence and self.evidence:
            doc["evidence"] = self.evidence
        return doc


@dataclass(frozen=True)
class Verdict:
    network_ok: bool
    culprits: tuple[Culprit, ...]
    stats: dict = field(default_factory=dict, compare=False)

    def to_document(self, evidence: bool = False) -> dict:
        return {"format": VERDICT_FORMAT, "network_ok": self.network_ok,
                "culprits": [c.to_document(evidence) for c in self.culprits]}


# ---- one channel --------------------------------------------------------------------------


@dataclass
class _Found:
    element: int
    confidence: float
    value: float  # loss rate, or delay activation
    support: int
    channel: str
    tau: float = 1.0
    both: bool = False  # the element in both directions at once


class _Channel:
    """The pool, columns and SparseGLM of one channel, grown by rescreening.

    Every column is a spec (one element direction, or an element in both directions) at a
    coverage threshold tau (delay channels; None for loss), kept in blocks of Columns: column j
    is position col_pos[j] of block col_block[j]. Growing the pool appends columns; the model
    found so far stays."""

    taus: tuple = (None,)
    scope: str | None = None  # the pairs the columns are needed on (None: all)

    def __init__(self, prep: Prepared, settings: Settings, kind: str):
        self.prep = prep
        self.model = prep.model
        self.s = settings
        self.kind = kind
        self.pool = np.zeros(0, dtype=np.int64)
        self.glm: SparseGLM | None = None
        self.blocks: list[Columns] = []
        self.keys: list = []
        self.key_pos: dict = {}
        self.col_block: list[int] = []
        self.col_pos: list[int] = []
        self.col_element: list[int] = []
        self.col_both: list[bool] = []
        self.col_tau: list[float] = []
        self._tried: set = set()  # exchanges and merges already decided
        self.last_excess: np.ndarray | None = None

    # what the channels define
    def setup(self) -> bool:
        raise NotImplementedError

    def start(self) -> SparseGLM:
        """The model with its forced (background) columns only."""
        raise NotImplementedError

    def block_stats(self, cols: Columns, tau, specs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(T, pen, cap) of a new block of columns."""
        raise NotImplementedError

    def _forced_keys(self) -> list:
        raise NotImplementedError

    # the shared machinery
    def _register_forced(self) -> None:
        for key in self._forced_keys():
            self.key_pos[key] = len(self.keys)
            self.keys.append(key)
            self.col_block.append(-1)
            self.col_pos.append(-1)
            self.col_element.append(-1)
            self.col_both.append(False)
            self.col_tau.append(0.0)

    def extend(self, new: np.ndarray) -> None:
        """Add pool elements: their columns (one direction, and both) at every threshold."""
        new = np.array([e for e in np.unique(new) if e not in set(self.pool.tolist())], dtype=np.int64)
        if new.size == 0:
            return
        self.pool = np.concatenate((self.pool, new))
        if self.glm is None:
            self.glm = self.start()
            self._register_forced()
        m, p = self.model, self.prep
        specs_all = _specs(m, new)
        for tau in self.taus:
            specs = [sp_ for sp_ in specs_all if (tau is None or tau >= 1.0 or m.kind[sp_[0]] <= KIND_SWITCH)
                     and (sp_, tau) not in self.key_pos]
            if not specs:
                continue
            cols = _spec_columns(p, specs, binary_tau=tau, scope=self.scope)
            T, pen, cap = self.block_stats(cols, tau, specs)
            first = cols.elements
            rank = np.array([_RANK[int(m.kind[e])] + 0.001 * (len(sp_) - 1) + 0.01 * (1.0 - (tau if tau is not None else 1.0))
                             for e, sp_ in zip(first, specs, strict=True)])
            self.glm.add_columns(p.restrict(cols, self.S), T, pen, rank, _culprit_groups(m, first), cap)
            b = len(self.blocks)
            self.blocks.append(cols)
            for q, sp_ in enumerate(specs):
                self.key_pos[(sp_, tau)] = len(self.keys)
                self.keys.append((sp_, tau))
                self.col_block.append(b)
                self.col_pos.append(q)
                self.col_element.append(int(sp_[0]))
                self.col_both.append(len(sp_) == 2)
                self.col_tau.append(1.0 if tau is None else float(tau))

    def column_elements(self) -> np.ndarray:
        return np.array(self.col_element, dtype=np.int64)

    def full_columns(self, cols: list[int]) -> sp.csc_matrix:
        """[pairs x len(cols)] columns over every pair of the window."""
        everyone = np.arange(self.prep.n)
        by_block: dict[int, list[int]] = {}
        for i, j in enumerate(cols):
            by_block.setdefault(self.col_block[j], []).append(i)
        parts, order = [], []
        for b, idx in by_block.items():
            pos = np.array([self.col_pos[cols[i]] for i in idx], dtype=np.int64)
            parts.append(self.prep.restrict(_select(self.blocks[b], pos), everyone))
            order += idx
        out = sp.hstack(parts, format="csc")
        return out[:, np.argsort(np.array(order))]

    def grow(self, excess: np.ndarray, expected: np.ndarray) -> bool:
        """Add what stands out in a screening pass to the pool and search again; False when
        nothing new did (the channel is then done)."""
        self.last_excess = excess
        new = self._top(excess, expected, exclude=self.pool, residual=self.glm is not None)
        if new.size == 0:
            return False
        before = self._active_elements()
        self.extend(new)
        self.glm.select()
        self._exchange_switches()
        # the residual changed only if the model did: otherwise screening again finds the same
        return self._active_elements() != before

    def _exchange_switches(self) -> None:
        """Aggregates against their parts, both ways: an active switch may stand for several
        smaller elements around it, and several active links of one switch (or NICs of one
        host) may be that switch (host). Each change is kept only if the model scores higher;
        each question is asked once per window."""
        m, glm = self.model, self.glm
        ce = self.column_elements()
        # (loss: a switch fits its losses far better than its parts, and the question is costly)
        sw = [j for j in glm.active if m.kind[ce[j]] == KIND_SWITCH and ("x", int(ce[j])) not in self._tried
              and self.kind != "loss"]
        for j in sw:
            self._tried.add(("x", int(ce[j])))
        if sw:
            glm.exchange(sw)
        idx = m.index
        parents: dict[tuple[int, int], list[int]] = {}
        for j in glm.active:
            e = int(ce[j])
            if e < 0:
                continue
            if m.kind[e] == KIND_LINK:
                k = e // 2
                for s in (int(idx.link_switch_a[k]), int(idx.link_switch_b[k])):
                    if s >= 0:
                        parents.setdefault((KIND_SWITCH, s), []).append(j)
                for end in (idx.link_a[k], idx.link_b[k]):  # the access links of a multi-homed NIC
                    nic = idx.nic_index.get(end)
                    if nic is not None:
                        parents.setdefault((KIND_NIC, nic), []).append(j)
            elif m.kind[e] == KIND_NIC:
                parents.setdefault((KIND_HOST, int(m.nic_host[m.target[e]])), []).append(j)
        for (kind, t), js in parents.items():
            parts = frozenset(int(m.target[ce[j]]) for j in js)
            if len(parts) < 2 or ("m", kind, t, parts) in self._tried:
                continue
            self._tried.add(("m", kind, t, parts))
            want = {KIND_SWITCH: {2 * m.n_links + t}, KIND_HOST: {m.host_tx0 + t, m.host_rx0 + t},
                    KIND_NIC: {m.nic_tx0 + t, m.nic_rx0 + t}}[kind]
            missing = np.array([e for e in want if m.candidate[e]], dtype=np.int64)
            self.extend(missing)
            ce = self.column_elements()
            cand = [j for j in range(len(ce)) if int(ce[j]) in want and not glm.forced[j]]
            if cand:
                glm.try_replace(js, cand)

    def _active_elements(self) -> frozenset[int]:
        if self.glm is None:
            return frozenset()
        return frozenset(int(e) for e in self.column_elements()[self.glm.active])

    def reselect(self, known: set[int]) -> None:
        """Elements that other channels found faulty get a small penalty here: a link known to
        delay traffic explains tail anomalies better than an unknown switch next to it. Each
        known element is tried in place of the active columns sharing its pairs."""
        if self.glm is None or not known:
            return
        m, glm = self.model, self.glm
        known = {e for e in known if m.candidate[e]}
        if self.last_excess is not None:  # nothing left for it to explain here: no question
            known = {e for e in known if self.last_excess[e] > 1.0 or e in set(self.pool.tolist())}
        if not known:
            return
        self.extend(np.array(sorted(known), dtype=np.int64))
        ce = self.column_elements()
        mine = np.isin(ce, np.array(sorted(known), dtype=np.int64)) & ~glm.forced
        glm.pen[mine] = np.minimum(glm.pen[mine], 0.5 * math.log(max(self.prep.n, 2)) + math.log(1 + len(known)))
        glm.select()
        ptr, ind = glm.X.indptr, glm.X.indices
        for e in sorted(known):
            cols = [j for j in np.flatnonzero(ce == e) if j not in glm.active]
            if not cols or any(ce[j] == e for j in glm.active):
                continue
            rows = np.unique(np.concatenate([ind[ptr[j]:ptr[j + 1]] for j in cols]))
            mask = np.zeros(glm.X.shape[0], dtype=bool)
            mask[rows] = True
            overlap = [j for j in glm.active if mask[ind[ptr[j]:ptr[j + 1]]].any()]
            if overlap:
                glm.try_replace(overlap, cols)
        self._exchange_switches()

    def _top(self, excess: np.ndarray, expected: np.ndarray, exclude: np.ndarray, residual: bool) -> np.ndarray:
        """Pool candidates: per kind of fabric element the top by excess and by excess /
        sqrt(expected); NIC and host directions (whose columns cost nothing) every one that
        stands out, and the top few by excess."""
        m, s = self.model, self.s
        z = excess / np.sqrt(expected + 1.0)
        ok = m.candidate & (excess > 0)
        if residual:  # later rounds: only what still stands out
            ok &= (z > 3.0) & (excess > 1.0)
        ok[exclude] = False
        picks = []
        for kind in (KIND_LINK, KIND_SWITCH):
            sel = np.flatnonzero(ok & (m.kind == kind))
            for score in (excess[sel], z[sel]):
                picks.append(sel[np.argsort(-score, kind="stable")[: s.pool_fabric]])
        # and the strongest links of the switches that stand out: one lossy link is outshone
        # by the many links of a lossy switch elsewhere, but not at its own switches
        sw_ok = np.flatnonzero(ok[2 * m.n_links: m.n_fabric]) + 2 * m.n_links
        top_sw = sw_ok[np.argsort(-z[sw_ok], kind="stable")[: s.pool_fabric // 2]] - 2 * m.n_links
        for sw in top_sw.tolist():
            around = m.switch_link_elements(sw)
            around = around[ok[around]]
            picks.append(around[np.argsort(-z[around], kind="stable")[:3]])
        sel = np.flatnonzero(ok & (m.kind >= KIND_NIC))
        picks.append(sel[np.argsort(-excess[sel], kind="stable")[: s.pool_fabric]])
        strong = sel[(z[sel] > 2.0) & (excess[sel] > 0.5)]
        picks.append(strong[np.argsort(-z[strong], kind="stable")[: s.pool_edge]])
        return np.unique(np.concatenate(picks)) if picks else np.zeros(0, dtype=np.int64)


class _Loss(_Channel):
    def setup(self) -> bool:
        p = self.prep
        self.S = np.flatnonzero(p.lost > 0)
        if self.S.size == 0:
            return False
        n, k, h = p.sent, p.lost, p.hops_bg
        self.bg_cols = np.stack((h, np.ones(p.n)), axis=1)
        self.bg_T = np.array([float(n @ h), float(n.sum())])
        total = float(k.sum())
        self.bg0 = np.minimum(np.array([0.5 * total / max(self.bg_T[0], 1.0), 0.5 * total / max(self.bg_T[1], 1.0)]),
                              self.s.loss_floor / 3)
        self.pen = math.log(max(int(self.model.candidate.sum()), 2)) + 0.5 * math.log(max(p.n, 2))
        self.scope = "lossy"
        p.set_scope(self.scope, self.S)
        return True

    def _forced_keys(self) -> list:
        return [("bg", "hop"), ("bg", "pair")]

    def expected(self, expo: np.ndarray) -> np.ndarray:
        """Expected losses per element under the background: b1 (probes x hops) + b0 probes."""
        self.expo_sent = expo[:, 1]
        return expo[:, 0] * self.bg0[0] + expo[:, 1] * self.bg0[1]

    def start(self) -> SparseGLM:
        p = self.prep
        k, n = p.lost[self.S], p.sent[self.S]
        family = PoissonBurst(k, n, self.s.burst_prior, self.s.burst_q) if self.s.burst_prior > 0 else Poisson(k)
        # background is small by definition: a loss rate shared by every pair and above a third
        # of the reporting floor is a fault of whatever element they share
        cap = np.full(2, self.s.loss_floor / 3)
        glm = SparseGLM(family, sp.csc_matrix(self.bg_cols[self.S]), self.bg_T, np.zeros(2), np.ones(2, dtype=bool),
                        np.full(2, -1.0), np.array([-1, -2]), cap)
        glm.start(self.bg0)
        return glm

    def block_stats(self, cols: Columns, tau, specs):
        # the columns cover the lossy pairs only; their exposures come from the window's
        # exposure pass (sum over every pair of sent x share)
        k = len(cols.elements)
        T = np.array([sum(self.expo_sent[e] for e in sp_) for sp_ in specs])
        return T, np.full(k, self.pen), np.ones(k)

    def _mu(self, glm: SparseGLM | None) -> np.ndarray:
        if glm is None:
            return self.bg_cols @ self.bg0
        mu = self.bg_cols @ glm.theta[:2]
        if glm.active:  # over every pair: the active columns again, unscoped
            specs = [self.keys[j][0] for j in glm.active]
            full = self.prep.restrict(_spec_columns(self.prep, specs), np.arange(self.prep.n))
            mu = mu + full @ glm.theta[glm.active]
        return mu

    def screen_weights(self, glm: SparseGLM | None) -> np.ndarray:
        p = self.prep
        mu = self._mu(glm)
        return np.stack((p.lost - p.sent * mu, p.sent * mu), axis=1)

    def report(self, glm: SparseGLM) -> list[_Found]:
        p = self.prep
        b1, b0 = glm.theta[0], glm.theta[1]
        per_link = (b1 * float(p.sent @ p.hops_bg) + b0 * float(p.sent.sum())) / max(float(p.sent @ p.hops_bg), 1.0)
        floor = max(self.s.loss_floor, self.s.bg_multiple * per_link)
        self.floor = floor
        out = []
        for j in glm.active:
            rate = float(glm.theta[j])
            support = glm.support(j)
            if rate < floor or support < self.s.min_support:
                continue
            conf = glm.posterior(j) * glm.floor_probability(j, floor)
            out.append(_Found(self.col_element[j], conf, rate, support, "loss", both=self.col_both[j]))
        return out


class _Delay(_Channel):
    """Median (`which` = 'p50') or tail ('p99') delay anomalies, noisy-OR over coverage tau."""

    def __init__(self, prep: Prepared, settings: Settings, which: str):
        super().__init__(prep, settings, which)
        self.which = which
        # a median moves only when more than half of a pair's probes are delayed: the median
        # channel never claims coverage below one half
        cov = settings.coverage
        self.taus = tuple(t for t in cov if t >= 0.5) if which == "p50" else tuple(cov)

    def setup(self) -> bool:
        p, s = self.prep, self.s
        values = p.p50 if self.which == "p50" else p.p99
        usable = np.isfinite(p.p50) & np.isfinite(p.p99) & (p.sent - p.lost >= s.min_delivered)
        self.usable = usable
        anomalous = np.zeros(p.n, dtype=bool)
        hops = p.hops_bg
        for h in np.unique(hops[usable]):
            g = usable & (hops == h)
            v = values[g]
            med = float(np.median(v))
            mad = 1.4826 * float(np.median(np.abs(v - med)))
            scale = max(mad, 1e-3 * abs(med), 1e-3)
            if g.sum() < 8:  # too few pairs for a spread of their own: use the window's
                scale = max(scale, self._pooled_scale(values, usable, hops))
            anomalous[g] = (v - med > s.delay_z * scale) & (v - med > s.delay_rel * med)
        self.anomalous = anomalous
        self.S = np.flatnonzero(anomalous)
        if self.S.size < s.min_support:
            return False
        self.n_normal = float(np.count_nonzero(usable & ~anomalous))
        self.normal_w = (usable & ~anomalous).astype(np.float64)
        self.normal_c = p.class_sums(self.normal_w)
        self.rate0 = max(self.S.size / max(float(usable.sum()), 1.0), 1e-6)
        self.pen = (math.log(max(int(self.model.candidate.sum()) * len(self.taus), 2))
                    + 0.5 * math.log(max(int(usable.sum()), 2)))
        pi = s.noisy_end_prior
        # noisy end hosts are common (the spec's noisy host): in the tail, a far smaller price
        self.pen_end = (math.log((1 - pi) / pi) + 0.5 * math.log(max(int(usable.sum()), 2))
                        if self.which == "p99" else self.pen)
        return True

    @staticmethod
    def _pooled_scale(values, usable, hops) -> float:
        dev = []
        for h in np.unique(hops[usable]):
            v = values[usable & (hops == h)]
            dev.append(np.abs(v - np.median(v)))
        d = np.concatenate(dev)
        return 1.4826 * float(np.median(d)) if d.size else 0.0

    def _forced_keys(self) -> list:
        return [("bg",)]

    def expected(self, expo: np.ndarray) -> np.ndarray:
        """Variance of the anomaly count per element under the background rate."""
        return expo[:, 2] * self.rate0 * (1 - self.rate0)

    def start(self) -> SparseGLM:
        glm = SparseGLM(NoisyOr(), sp.csc_matrix(np.ones((self.S.size, 1))), np.array([self.n_normal]),
                        np.zeros(1), np.ones(1, dtype=bool), np.full(1, -1.0), np.array([-1]),
                        np.full(1, NoisyOr.cap))
        glm.start(np.array([-math.log1p(-self.rate0)]))
        return glm

    def block_stats(self, cols: Columns, tau, specs):
        m = self.model
        T = self.prep.totals(cols, self.normal_w, self.normal_c)
        pen = np.where(m.kind[cols.elements] >= KIND_NIC, self.pen_end, self.pen)
        return T, pen, np.full(len(cols.elements), NoisyOr.cap)

    def _prob(self, glm: SparseGLM | None) -> np.ndarray:
        p = self.prep
        if glm is None:
            return np.full(p.n, self.rate0)
        eta = np.full(p.n, glm.theta[0])
        if glm.active:
            eta = eta + self.full_columns(glm.active) @ glm.theta[glm.active]
        return -np.expm1(-eta)

    def screen_weights(self, glm: SparseGLM | None) -> np.ndarray:
        P = self._prob(glm)
        u = self.usable
        t = self.anomalous.astype(np.float64)
        return np.stack((np.where(u, t - P, 0.0), np.where(u, P * (1 - P), 0.0)), axis=1)

    def report(self, glm: SparseGLM) -> list[_Found]:
        out = []
        m = self.model
        for j in glm.active:
            e = self.col_element[j]
            act = -math.expm1(-float(glm.theta[j]))
            support = glm.support(j)
            if act < self.s.min_activation or support < self.s.min_support:
                continue
            if self.which == "p99" and m.kind[e] in (KIND_NIC, KIND_HOST):
                continue  # a noisy tail at an end host is not a fault
            floor = -math.log1p(-self.s.min_activation)
            conf = glm.posterior(j) * glm.floor_probability(j, floor)
            out.append(_Found(e, conf, act, support, self.which, self.col_tau[j], both=self.col_both[j]))
        return out


def _select(cols, sel: np.ndarray):
    """The sub-Columns of the given column positions (renumbered 0..len(sel)-1)."""
    lut = np.full(len(cols.elements), -1, dtype=np.int64)
    lut[sel] = np.arange(len(sel))
    me = lut[cols.ecmp_col] >= 0
    mp = lut[cols.pair_col] >= 0
    return Columns(cols.elements[sel], cols.ecmp_class[me], lut[cols.ecmp_col[me]], cols.ecmp_x[me],
                   cols.pair_row[mp], lut[cols.pair_col[mp]], cols.pair_x[mp])


def _culprit_groups(m: FabricModel, elements: np.ndarray) -> np.ndarray:
    """The culprit each element names, as one number: posteriors add up over a group. The NIC
    of a one-NIC host names the host (formats/fabric.md), so it shares the host's group."""
    kind = m.kind[elements].astype(np.int64)
    target = m.target[elements].astype(np.int64)
    nic = kind == KIND_NIC
    lone = nic & (m.nics_per_host[m.nic_host[np.where(nic, target, 0)]] == 1)
    target = np.where(lone, m.nic_host[np.where(nic, target, 0)], target)
    kind = np.where(lone, KIND_HOST, kind)
    return kind * (1 << 40) + target


def _partner(m: FabricModel, e: int) -> int:
    """The other direction of a directed element (-1 for a switch)."""
    if e < 2 * m.n_links:
        return e ^ 1
    if e < m.n_fabric:
        return -1
    if e < m.nic_rx0:
        return e + m.n_nics
    if e < m.host_tx0:
        return e - m.n_nics
    if e < m.host_rx0:
        return e + m.n_hosts
    return e - m.n_hosts


def _specs(m: FabricModel, pool: np.ndarray) -> list[tuple[int, ...]]:
    """Candidate columns of a pool: each element direction alone, and each element in both
    directions at once (a cable or a NIC that drops both ways pays one penalty, not two)."""
    out = [(int(e),) for e in pool]
    seen: set[tuple[int, int]] = set()
    for e in pool.tolist():
        q = _partner(m, e)
        if q >= 0 and m.candidate[q]:
            key = (min(e, q), max(e, q))
            if key not in seen:
                seen.add(key)
                out.append(key)
    return out


def _spec_columns(prep: Prepared, specs: list[tuple[int, ...]], binary_tau: float | None = None,
                  scope: str | None = None) -> Columns:
    """Columns of specs (tuples of elements, summed); with binary_tau, coverage x >= tau of each
    element, 1 where any element of the spec covers the pair. scope: see Prepared.columns."""
    elems = np.array(sorted({e for sp_ in specs for e in sp_}), dtype=np.int64)
    base = prep.columns(elems, scope)
    if binary_tau is not None:
        t = binary_tau
        base = base.transformed(lambda x: (x >= t * (1 - 1e-9)).astype(np.float64) if t > 0
                                else (x > 0).astype(np.float64))
    pos = {int(e): i for i, e in enumerate(elems)}
    mem_e = np.array([pos[e] for sp_ in specs for e in sp_], dtype=np.int64)
    mem_s = np.array([i for i, sp_ in enumerate(specs) for _ in sp_], dtype=np.int64)
    order = np.argsort(mem_e, kind="stable")
    mem_e, mem_s = mem_e[order], mem_s[order]
    cnt = np.bincount(mem_e, minlength=len(elems))
    ptr = np.concatenate(([0], np.cumsum(cnt)))
    k = len(specs)

    def spread(unit, col, x):
        c = cnt[col]
        idx = np.repeat(ptr[col], c) + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c))
        u, s_, v = np.repeat(unit, c), mem_s[idx], np.repeat(x, c)
        if binary_tau is None or u.size == 0:
            return u, s_, v
        key, inv = np.unique(u * k + s_, return_inverse=True)
        vv = np.zeros(len(key))
        np.maximum.at(vv, inv, v)
        return key // k, key % k, vv

    ec, es, ex = spread(base.ecmp_class, base.ecmp_col, base.ecmp_x)
    pr, ps, px = spread(base.pair_row, base.pair_col, base.pair_x)
    first = np.array([sp_[0] for sp_ in specs], dtype=np.int64)
    return Columns(first, ec, es, ex, pr, ps, px)


# ---- the verdict --------------------------------------------------------------------------


def localize(prep: Prepared, settings: Settings = Settings()) -> Verdict:
    """The verdict of one prepared window. All channels screen together: one adjoint pass per
    round over every element, for every channel still growing its pool."""
    channels = [ch for ch in (_Loss(prep, settings, "loss"), _Delay(prep, settings, "p50"),
                              _Delay(prep, settings, "p99")) if ch.setup()]
    live = list(channels)
    rounds = 0
    # each element's expected count under the null model (it only scales the z ranking of the
    # screening) from exposures that a stable probe plan computes once: probes x hops, probes,
    # pairs
    if live:
        expo = prep.adjoint(np.stack((prep.sent * prep.hops_bg, prep.sent, np.ones(prep.n)), axis=1), cache=True)
    expected = {ch.kind: ch.expected(expo) for ch in live}
    for _ in range(settings.rescreen_rounds):
        if not live:
            break
        rounds += 1
        adj = prep.adjoint(np.stack([ch.screen_weights(ch.glm)[:, 0] for ch in live], axis=1))
        live = [ch for i, ch in enumerate(live) if ch.grow(adj[:, i], expected[ch.kind])]
    reports = {ch.kind: ch.report(ch.glm) for ch in channels if ch.glm is not None}
    # reconcile: each channel again, with the elements the others found as known suspects
    for ch in channels:
        if ch.glm is None:
            continue
        known = {f.element for k, fs in reports.items() if k != ch.kind for f in fs}
        mine = {int(e) for e in ch.column_elements()[ch.glm.active]} if ch.glm.active else set()
        if known - mine:
            ch.reselect(known)
            reports[ch.kind] = ch.report(ch.glm)
    found = [f for fs in reports.values() for f in fs]
    return _verdict(prep.model, found, {"pairs": prep.n, "rounds": rounds}, settings.min_confidence)


def _verdict(model: FabricModel, found: list[_Found], stats: dict, min_confidence: float = 0.0) -> Verdict:
    idx = model.index
    by_key: dict[tuple[int, int], list[_Found]] = {}
    for f in found:
        key = (int(model.kind[f.element]), int(model.target[f.element]))
        by_key.setdefault(key, []).append(f)
    conf: dict[tuple[int, int], float] = {}
    evidence: dict[tuple[int, int], dict] = {}
    for key, fs in by_key.items():
        conf[key] = 1.0 - math.prod(1.0 - min(max(f.confidence, 0.0), 1.0) for f in fs)
        ev: dict = {}
        for f in fs:
            label = model.label(f.element, both=f.both)
            if f.channel == "loss":
                ev.setdefault("loss", {})[label] = round(f.value, 6)
            else:
                ev.setdefault(f.channel, {})[label] = {"activation": round(f.value, 4), "coverage": f.tau}
            ev.setdefault("pairs", 0)
            ev["pairs"] = max(ev["pairs"], f.support)
        evidence[key] = ev

    # a host all of whose NICs are culprits is the host; NICs of a culprit host fold into it
    nic_keys = [k for k in conf if k[0] == KIND_NIC]
    per_host: dict[int, list[tuple[int, int]]] = {}
    for k in nic_keys:
        per_host.setdefault(int(model.nic_host[k[1]]), []).append(k)
    for h, ks in per_host.items():
        host_key = (KIND_HOST, h)
        if host_key in conf or (len(ks) == model.nics_per_host[h] and model.nics_per_host[h] > 1):
            c = conf.get(host_key, 0.0)
            conf[host_key] = max(c, min(conf[k] for k in ks)) if host_key not in conf else c
            for k in ks:
                evidence.setdefault(host_key, {}).setdefault("nics", []).append(idx.nic_names[k[1]])
                conf.pop(k)
    # a switch all of whose ports (links, or NICs for access links) are culprits is the switch
    ports = model.switch_ports()
    for s, ks in ports.items():
        if len(ks) > 1 and all(k in conf for k in ks):
            conf[(KIND_SWITCH, s)] = max(conf.get((KIND_SWITCH, s), 0.0), min(conf[k] for k in ks))
            for k in ks:
                conf.pop(k)

    names = (idx.link_ids, idx.switch_names, idx.nic_names, idx.host_names)
    kinds = ("link", "switch", "nic", "host")
    # a culprit more likely wrong than right costs more than it brings (for F1, a culprit of
    # confidence p is worth naming when p > F1 / 2)
    culprits = [Culprit(kinds[k], names[k][t], float(c), evidence.get((k, t), {}))
                for (k, t), c in conf.items() if c >= min_confidence]
    culprits.sort(key=lambda c: (-c.confidence, c.kind, c.name))
    network_ok = not any(c.kind in ("link", "switch", "nic") for c in culprits)
    return Verdict(network_ok, tuple(culprits), stats)
