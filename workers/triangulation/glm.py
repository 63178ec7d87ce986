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

    def best_theta(self, cols: np.ndarray, eta: np.ndarray | None = None):
        """For each column: (theta, gain) maximizing LL over that column alone, the other
        columns' contribution fixed at `eta` (default: the current model without the column)."""
        cols = np.asarray(cols, dtype=np.int64)
        k = len(cols)
        if k == 0:
            return np.zeros(0), np.zeros(0)
        fam = self.family
        rows, x, seg = self._gather(cols)
        base = self.eta[rows] - x * self.theta[cols][seg] if eta is None else eta[rows]
        base = np.maximum(base, 1e-300)
        yv = self.y[rows]
        T = self.T[cols]
        Y = np.bincount(seg, weights=yv, minlength=k)

        def g1(th):
            return np.bincount(seg, weights=yv * x * fam.f1(base + x * th[seg]), minlength=k) - T

        def g2(th):
            return np.bincount(seg, weights=yv * x * x * fam.f2(base + x * th[seg]), minlength=k)

        cap = self.cap[cols]
        lo = np.zeros(k)
        with np.errstate(divide="ignore", invalid="ignore"):
            hi = np.where(T > 0, np.minimum(cap, Y / np.where(T > 0, T, 1.0) * (1 + 1e-9)), cap)
        d0 = g1(lo)
        live = d0 > 0
        theta = np.zeros(k)
        at_cap = live & (g1(hi) >= 0)
        theta[at_cap] = hi[at_cap]
        live &= ~at_cap
        th = np.where(live, hi / 2, 0.0)
        for _ in range(_NEWTON_STEPS):
            if not live.any():
                break
            d1 = g1(th)
            up = live & (d1 > 0)
            down = live & (d1 <= 0)
            lo = np.where(up, th, lo)
            hi = np.where(down, th, hi)
            d2 = g2(th)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = th - d1 / d2
            bad = ~np.isfinite(step) | (step <= lo) | (step >= hi)
            nxt = np.where(bad, (lo + hi) / 2, step)
            done = live & ((np.abs(nxt - th) <= 1e-10 * np.maximum(th, 1e-12)) | (hi - lo <= 1e-12 * hi))
            th = np.where(live, nxt, th)
            live &= ~done
        theta = np.where(at_cap, theta, np.where(d0 > 0, th, 0.0))
        gain = np.bincount(seg, weights=yv * (fam.f(base + x * theta[seg]) - fam.f(base)), minlength=k) - theta * T
        return theta, np.maximum(gain, 0.0)

    # ---- the model ------------------------------------------------------------------------

    def loglik(self) -> float:
        return float(np.sum(self.y * self.family.f(np.maximum(self.eta, 1e-300))) - self.theta @ self.T)

    def _set(self, j: int, value: float) -> None:
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        self.eta[self.X.indices[a:b]] += self.X.data[a:b] * (value - self.theta[j])
        self.theta[j] = value

    def refit(self, sweeps: int = 30, tol: float = 1e-7) -> None:
        cols = [j for j in np.flatnonzero(self.forced)] + self.active
        for _ in range(sweeps):
            before = self.loglik()
            for j in cols:
                th, _ = self.best_theta(np.array([j]))
                self._set(j, float(th[0]))
            if self.loglik() - before <= tol * max(1.0, abs(before)):
                break

    def start(self, theta_forced: np.ndarray) -> None:
        for j, v in zip(np.flatnonzero(self.forced), theta_forced, strict=True):
            self._set(int(j), float(v))
        self.refit()

    def drop_gain(self, j: int) -> float:
        """LL lost by setting column j to 0, the others fixed."""
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        rows, x = self.X.indices[a:b], self.X.data[a:b]
        e = self.eta[rows]
        e0 = np.maximum(e - x * self.theta[j], 1e-300)
        f = self.family.f
        return float(np.sum(self.y[rows] * (f(e) - f(e0))) - self.theta[j] * self.T[j])

    def _pick(self, cand: np.ndarray, score: np.ndarray) -> int:
        best = score.max()
        near = np.flatnonzero(score >= best - 1e-9 * max(1.0, abs(best)))
        return int(cand[near[np.argmin(self.rank[cand[near]])]])

    def select(self, max_active: int = 64) -> None:
        """Forward selection with refit, then backward pruning."""
        P = self.X.shape[1]
        pool = np.flatnonzero(~self.forced & (self.col_nnz > 0))
        while len(self.active) < max_active:
            cand = np.setdiff1d(pool, self.active, assume_unique=True)
            if cand.size == 0:
                break
            _, gain = self.best_theta(cand)
            score = gain - self.pen[cand]
            if score.max() <= 0:
                break
            j = self._pick(cand, score)
            th, _ = self.best_theta(np.array([j]))
            self._set(j, float(th[0]))
            self.active.append(j)
            self.refit()
        self.prune()
        del P

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
        base = np.maximum(self.eta[rows] - x * th, 1e-300)
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
