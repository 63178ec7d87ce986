"""Sparse non-negative GLM selection: the search engine of every triangulation channel.

Model: a linear predictor eta_i = sum_j x[i, j] theta_j (theta >= 0) over the pairs i, and a
log-likelihood that only needs the pairs with a positive observation y_i > 0:

    LL(theta) = sum_{i: y_i > 0} y_i f(eta_i) - sum_j theta_j T_j

- Poisson loss model: eta_i = expected loss rate per probe of pair i, y_i = probes lost,
  f = log, T_j = sum over *all* pairs of sent_i x[i, j] (the element's probe exposure). Exactly
  the Poisson log-likelihood sum_i (k_i log mu_i - n_i mu_i) without its constant, since the
  pairs that lost nothing only contribute -n_i mu_i, which is linear in theta.
- Noisy-OR model (Boolean tomography of delay anomalies): eta_i = -log P(pair i is normal),
  y_i = 1 for an anomalous pair, f(eta) = log(1 - exp(-eta)), T_j = number of normal pairs that
  column j covers.

Columns are candidate elements (and the always-on background columns). The search is forward
selection with refit (greedy, like orthogonal matching pursuit for GLMs): at each step every
candidate's best theta and log-likelihood gain are found by a safeguarded Newton method,
vectorized over all candidates; the best gain is accepted when it beats the candidate's
penalty (a model-selection price in nats, extended-BIC style); all active parameters are then
refit by coordinate ascent. A backward pass drops any active column whose drop gain no longer
pays its penalty. Ties (columns the data cannot tell apart) go to the lower `rank`.

Posterior probabilities per group of columns (`posterior`): swap one active column for any
candidate (or for nothing), the others fixed; each alternative weighs exp(gain - penalty). With
the penalty read as -log prior odds, this is the posterior probability that the group is the
one element behind that part of the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

_NEWTON_STEPS = 60


@dataclass(frozen=True)
class Family:
    name: str
    cap: float  # largest theta a column may take

    def f(self, eta):
        return np.log(eta) if self.name == "poisson" else np.log(-np.expm1(-eta))

    def f1(self, eta):
        return 1.0 / eta if self.name == "poisson" else 1.0 / np.expm1(eta)

    def f2(self, eta):
        if self.name == "poisson":
            return -1.0 / (eta * eta)
        h = np.sinh(np.minimum(eta, 700.0) / 2.0)
        return -1.0 / (4.0 * h * h)


POISSON = Family("poisson", cap=1.0)
NOISY_OR = Family("noisyor", cap=30.0)


class SparseGLM:
    """Columns X (csc, positive pairs x P), totals T, penalties; see the module docstring.

    forced: columns always active and unpenalized (the background). rank: tie-break order
    (lower wins). group: the element each column stands for (posteriors sum over a group).
    cap: per-column upper bound of theta (default the family's).
    """

    def __init__(self, family: Family, y: np.ndarray, X: sp.csc_matrix, T: np.ndarray, pen: np.ndarray,
                 forced: np.ndarray, rank: np.ndarray, group: np.ndarray, cap: np.ndarray | None = None):
        self.family = family
        self.y = np.asarray(y, dtype=np.float64)
        self.X = sp.csc_matrix(X)
        self.X.sort_indices()
        self.T = np.asarray(T, dtype=np.float64)
        self.pen = np.asarray(pen, dtype=np.float64)
        self.forced = np.asarray(forced, dtype=bool)
        self.rank = np.asarray(rank, dtype=np.float64)
        self.group = np.asarray(group, dtype=np.int64)
        P = self.X.shape[1]
        self.cap = np.full(P, family.cap) if cap is None else np.minimum(np.asarray(cap, dtype=np.float64),
                                                                         family.cap)
        self.theta = np.zeros(P)
        self.eta = np.zeros(self.X.shape[0])
        self.active: list[int] = []
        self.col_nnz = np.diff(self.X.indptr)

    # ---- one-dimensional maximization, vectorized over columns -----------------------------

    def _gather(self, cols: np.ndarray):
        ptr = self.X.indptr
        lengths = ptr[cols + 1] - ptr[cols]
        starts = ptr[cols]
        total = int(lengths.sum())
        if total:
            offs = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
            pos = np.arange(total, dtype=np.int64) + offs
        else:
            pos = np.zeros(0, dtype=np.int64)
        seg = np.repeat(np.arange(len(cols)), lengths)
        return self.X.indices[pos], self.X.data[pos], seg

    def best_theta(self, cols: np.ndarray, eta: np.ndarray | None = None, warm: bool = False):
        """For each column: (theta, gain) maximizing LL over that column alone, the other
        columns' contribution fixed at `eta` (default: the current model without the column).
        warm: start from the current theta (refits)."""
        cols = np.asarray(cols, dtype=np.int64)
        k = len(cols)
        if k == 0:
            return np.zeros(0), np.zeros(0)
        fam = self.family
        rows, x, seg = self._gather(cols)
        base = self.eta[rows] - x * self.theta[cols][seg] if eta is None else eta[rows]
        base = np.maximum(base, 1e-100)
        yv = self.y[rows]
        T = self.T[cols]
        Y = np.bincount(seg, weights=yv, minlength=k)

        def g1(th):
            return np.bincount(seg, weights=yv * x * fam.f1(base + x * th[seg]), minlength=k) - T

        cap = self.cap[cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            hi = np.where(T > 0, np.minimum(cap, Y / np.where(T > 0, T, 1.0)), cap)
        theta = np.zeros(k)
        live = g1(theta) > 0
        unbound = live & (hi >= cap)  # at the cap? possible only where the bound Y / T did not bind
        at_cap = unbound & (g1(np.where(unbound, cap, 0.0)) >= 0)
        theta[at_cap] = cap[at_cap]
        live &= ~at_cap
        # safeguarded Newton on g1 = dLL/dtheta (decreasing): keep a bracket [lo, hi] around the
        # root; a step leaving it falls back to the geometric middle (or hi / 100 while lo = 0)
        todo = np.flatnonzero(live)
        lo = np.zeros(k)
        start = self.theta[cols] if warm else hi / 2
        th_all = np.where((start > 0) & (start < hi), start, hi / 2)
        for it in range(_NEWTON_STEPS):
            if todo.size == 0:
                break
            if it % 4 == 0:  # compact to the columns still moving
                lut = np.full(k, -1, dtype=np.int64)
                lut[todo] = np.arange(len(todo))
                sel = lut[seg] >= 0
                s_seg, s_x, s_y, s_base = lut[seg[sel]], x[sel], yv[sel], base[sel]
                s_T, s_cols = T[todo], todo
                s_lo, s_hi, s_th = lo[todo], hi[todo], th_all[todo]
                alive = np.ones(len(todo), dtype=bool)
                m = len(todo)
            e = s_base + s_x * s_th[s_seg]
            d1 = np.bincount(s_seg, weights=s_y * s_x * fam.f1(e), minlength=m) - s_T
            d2 = np.bincount(s_seg, weights=s_y * s_x * s_x * fam.f2(e), minlength=m)
            s_lo = np.where(d1 > 0, s_th, s_lo)
            s_hi = np.where(d1 <= 0, s_th, s_hi)
            with np.errstate(divide="ignore", invalid="ignore"):
                nxt = s_th - d1 / d2
            fallback = np.where(s_lo > 0, np.sqrt(s_lo * s_hi), s_hi / 100.0)
            nxt = np.where(np.isfinite(nxt) & (nxt > s_lo) & (nxt < s_hi), nxt, fallback)
            alive &= (np.abs(nxt - s_th) > 1e-8 * s_th) & (s_hi - s_lo > 1e-10 * s_hi)
            s_th = np.where(alive, nxt, s_th)
            th_all[s_cols], lo[s_cols], hi[s_cols] = s_th, s_lo, s_hi
            todo = s_cols[alive]
        theta[live] = th_all[live]
        gain = np.bincount(seg, weights=yv * (fam.f(base + x * theta[seg]) - fam.f(base)), minlength=k) - theta * T
        return theta, np.maximum(gain, 0.0)

    # ---- the model ------------------------------------------------------------------------

    def loglik(self) -> float:
        return float(np.sum(self.y * self.family.f(np.maximum(self.eta, 1e-100))) - self.theta @ self.T)

    def _set(self, j: int, value: float) -> None:
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        self.eta[self.X.indices[a:b]] += self.X.data[a:b] * (value - self.theta[j])
        self.theta[j] = value

    def _colors(self, cols: list[int]) -> list[np.ndarray]:
        """Split columns into groups without common positive pairs (greedy colouring)."""
        groups: list[list[int]] = []
        masks: list[np.ndarray] = []
        ptr, ind = self.X.indptr, self.X.indices
        for j in cols:
            rows = ind[ptr[j]:ptr[j + 1]]
            for g, m in zip(groups, masks, strict=True):
                if not m[rows].any():
                    g.append(j)
                    m[rows] = True
                    break
            else:
                m = np.zeros(self.X.shape[0], dtype=bool)
                m[rows] = True
                groups.append([j])
                masks.append(m)
        return [np.array(g, dtype=np.int64) for g in groups]

    def refit(self, sweeps: int = 200, tol: float = 1e-4) -> None:
        """Maximize LL over the forced and active columns: block coordinate ascent, LL never
        decreasing. The forced (background) columns overlap everything and each other: one
        joint Newton block; the active columns in groups without common positive pairs, each
        group maximized exactly."""
        forced = np.flatnonzero(self.forced)
        groups = self._colors(self.active)
        cur = self.loglik()
        for _ in range(sweeps):
            if forced.size:
                self._joint(forced)
            for g in groups:
                th, _ = self.best_theta(g, warm=True)
                for j, v in zip(g.tolist(), th.tolist(), strict=True):
                    self._set(j, v)
            new = self.loglik()
            if new - cur <= tol:  # nats: far below any penalty
                break
            cur = new

    def _joint(self, cols: np.ndarray, steps: int = 30) -> None:
        """Projected Newton over a few columns at once, with a backtracking line search."""
        fam = self.family
        Xa = self.X[:, cols].toarray()
        th = self.theta[cols].copy()
        rest = self.eta - Xa @ th
        T, cap = self.T[cols], self.cap[cols]

        def ll(t):
            e = rest + Xa @ t
            return (-np.inf if np.any(e <= 0) else float(self.y @ fam.f(e) - t @ T)), e

        cur, e = ll(th)
        for _ in range(steps):
            g = Xa.T @ (self.y * fam.f1(np.maximum(e, 1e-100))) - T
            H = Xa.T @ (Xa * (self.y * fam.f2(np.maximum(e, 1e-100)))[:, None])
            free = ((th > 0) | (g > 0)) & ~((th >= cap) & (g > 0))
            if not free.any():
                break
            Hf = H[np.ix_(free, free)]
            try:
                d = np.linalg.solve(Hf - 1e-12 * np.abs(np.diag(Hf)).max() * np.eye(len(Hf)), -g[free])
            except np.linalg.LinAlgError:
                break
            step = np.zeros_like(th)
            step[free] = d
            t, ok = 1.0, False
            for _ls in range(30):
                cand = np.clip(th + t * step, 0.0, cap)
                val, e2 = ll(cand)
                if val >= cur:
                    ok = True
                    break
                t *= 0.5
            if not ok:
                break
            done = val - cur <= 1e-6
            th, cur, e = cand, val, e2
            if done:
                break
        for j, v in zip(cols.tolist(), th.tolist(), strict=True):
            self._set(j, v)

    def start(self, theta_forced: np.ndarray) -> None:
        for j, v in zip(np.flatnonzero(self.forced), theta_forced, strict=True):
            self._set(int(j), float(v))
        self.refit()

    def drop_gain(self, j: int) -> float:
        """LL lost by setting column j to 0, the others fixed."""
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        rows, x = self.X.indices[a:b], self.X.data[a:b]
        e = self.eta[rows]
        e0 = np.maximum(e - x * self.theta[j], 1e-100)
        f = self.family.f
        return float(np.sum(self.y[rows] * (f(e) - f(e0))) - self.theta[j] * self.T[j])

    def _batch(self, cand: np.ndarray, score: np.ndarray, limit: int) -> list[int]:
        """The candidates to add at once: best first (ties to the lower rank), each one only if
        it shares no positive pair with a better one taken now. Columns without common pairs
        have independent gains, so this is what one-at-a-time selection would add, in fewer
        refits."""
        good = score > 0
        cand, score = cand[good], score[good]
        if cand.size == 0:
            return []
        scale = max(1.0, float(np.abs(score).max()))
        quant = np.round(score / scale * 1e9)
        order = np.lexsort((self.rank[cand], -quant))
        taken = np.zeros(self.X.shape[0], dtype=bool)
        out: list[int] = []
        ptr, ind = self.X.indptr, self.X.indices
        for j in cand[order]:
            rows = ind[ptr[j]:ptr[j + 1]]
            if taken[rows].any():
                continue
            taken[rows] = True
            out.append(int(j))
            if len(out) >= limit:
                break
        return out

    def select(self, max_active: int = 256, batch: int = 64) -> None:
        """Forward selection with refit (disjoint candidates in batches), then backward pruning."""
        pool = np.flatnonzero(~self.forced & (self.col_nnz > 0))
        while len(self.active) < max_active:
            cand = np.setdiff1d(pool, self.active, assume_unique=True)
            if cand.size == 0:
                break
            th, gain = self.best_theta(cand)
            score = gain - self.pen[cand]
            picks = self._batch(cand, score, min(batch, max_active - len(self.active)))
            if not picks:
                break
            pos = {int(c): i for i, c in enumerate(cand)}
            for j in picks:
                self._set(j, float(th[pos[j]]))
                self.active.append(j)
            self.refit()
        self.prune()

    def prune(self) -> None:
        while self.active:
            drops = np.array([self.drop_gain(j) - self.pen[j] for j in self.active])
            w = int(np.argmin(drops))
            if drops[w] > 0:
                break
            self._set(self.active[w], 0.0)
            self.active.pop(w)
            self.refit()

    def remove(self, j: int) -> None:
        if j in self.active:
            self._set(j, 0.0)
            self.active.remove(j)
            self.refit()

    # ---- evidence -------------------------------------------------------------------------

    def posterior(self, j: int) -> float:
        """P(the group of active column j is the element), against single swaps and none."""
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        eta = self.eta.copy()
        eta[self.X.indices[a:b]] -= self.X.data[a:b] * self.theta[j]
        others = set(self.active) - {j}
        cand = np.array([c for c in np.flatnonzero(~self.forced & (self.col_nnz > 0)) if c not in others],
                        dtype=np.int64)
        _, gain = self.best_theta(cand, eta=eta)
        lp = gain - self.pen[cand]
        g = self.group[cand]
        top = max(0.0, float(lp.max()))
        w = np.exp(lp - top)
        mine = float(w[g == self.group[j]].sum())
        return mine / (np.exp(-top) + float(w.sum()))

    def floor_probability(self, j: int, floor: float) -> float:
        """P(theta_j >= floor) from the profile likelihood (normal approximation)."""
        th = self.theta[j]
        if floor <= 0:
            return 1.0
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        rows, x = self.X.indices[a:b], self.X.data[a:b]
        base = np.maximum(self.eta[rows] - x * th, 1e-100)
        f = self.family.f
        ll = np.sum(self.y[rows] * f(base + x * th)) - th * self.T[j]
        llf = np.sum(self.y[rows] * f(base + x * floor)) - floor * self.T[j]
        z = np.sqrt(max(0.0, 2.0 * (ll - llf)))
        from math import erf, sqrt

        p = 0.5 * (1.0 + erf(z / sqrt(2.0)))
        return p if th >= floor else 1.0 - p

    def support(self, j: int, share: float = 0.5) -> int:
        """Positive pairs that column j explains for the most part (its share of eta >= share)."""
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        rows, x = self.X.indices[a:b], self.X.data[a:b]
        return int(np.count_nonzero(x * self.theta[j] >= share * self.eta[rows]))
