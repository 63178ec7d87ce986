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

import numpy as np
import scipy.sparse as sp

_NEWTON_STEPS = 40
_JOINT_MAX = 24  # active columns up to which a refit is one joint Newton
_EXCHANGE_PARTS = 8  # smaller elements an exchange may put in place of one aggregate


class Family:
    """Per-row log-likelihood pieces f(eta) of the positive rows (observations folded in), and
    their first two derivatives in eta; `rows` index the positive rows.

    `bind(rows)` gathers the rows' observations once: the searches evaluate the same entries
    many times (every Newton step, every grid point), so the bound pieces (`Rows`) are what
    they call; `f`, `f1`, `f2` and `ybound` here are the one-off forms."""

    cap = 1.0
    concave = True

    def bind(self, rows) -> Rows:
        raise NotImplementedError

    def f(self, eta, rows):
        return self.bind(rows).f(eta)

    def ybound(self, rows):
        """y_i with f1(eta) <= y_i / eta for every eta (bounds the 1-D search)."""
        return self.bind(rows).ybound()

    def f1(self, eta, rows):
        return self.bind(rows).f1(eta)

    def f2(self, eta, rows):
        return self.bind(rows).f2(eta)


class Rows:
    """A family's pieces on fixed rows (see Family.bind); `take(sel)` keeps some of them."""

    def take(self, sel) -> Rows:
        raise NotImplementedError

    def f(self, eta):
        raise NotImplementedError

    def ybound(self):
        raise NotImplementedError

    def f1(self, eta):
        raise NotImplementedError

    def f2(self, eta):
        raise NotImplementedError

    def f12(self, eta):
        """(f1, f2) at the same eta, sharing what they have in common."""
        return self.f1(eta), self.f2(eta)


class Poisson(Family):
    """y log(eta): the Poisson log-likelihood of y lost probes at rate eta (the -n eta part is
    linear and lives in the totals T)."""

    def __init__(self, y: np.ndarray):
        self.y = np.asarray(y, dtype=np.float64)

    def bind(self, rows) -> Rows:
        return _PoissonRows(self.y[rows])


class _PoissonRows(Rows):
    def __init__(self, y):
        self.y = y

    def take(self, sel):
        return _PoissonRows(self.y[sel])

    def f(self, eta):
        return self.y * np.log(eta)

    def ybound(self):
        return self.y

    def f1(self, eta):
        return self.y / eta

    def f2(self, eta):
        return -self.y / (eta * eta)


class PoissonBurst(Family):
    """Poisson with bursts: a pair loses its k probes either as Poisson(n eta) or, with prior
    probability omega, in one burst tied to no element (k ~ geometric(q), the pair's normal
    losses then negligible). Per positive row: f = log((1 - omega) (n eta)^k / k! + omega g(k)),
    up to the constant and the linear -n eta of every pair. One burst explains a pair's losses
    for about -log(omega g(k)) nats, so no element is found from a few bursty pairs; losses
    that many pairs share still are. Not concave: maximized on a grid, then refined."""

    concave = False

    def __init__(self, k: np.ndarray, n: np.ndarray, omega: float, q: float):
        from scipy.special import gammaln

        k = np.asarray(k, dtype=np.float64)
        self.k = k
        self.c = np.log1p(-omega) + k * np.log(np.asarray(n, dtype=np.float64)) - gammaln(k + 1)
        self.b = np.log(omega) + np.log1p(-q) + (k - 1) * np.log(q)
        self.proxy = Poisson(k)  # concave, and close to it: ranks candidates cheaply

    def bind(self, rows) -> Rows:
        return _BurstRows(self.k[rows], self.c[rows], self.b[rows])


class _BurstRows(Rows):
    def __init__(self, k, c, b):
        self.k, self.c, self.b = k, c, b

    def take(self, sel):
        return _BurstRows(self.k[sel], self.c[sel], self.b[sel])

    def _s(self, eta):
        p = self.c + self.k * np.log(eta)
        return p, np.logaddexp(p, self.b)

    def f(self, eta):
        return self._s(eta)[1]

    def ybound(self):
        return self.k

    def f1(self, eta):
        p, f = self._s(eta)
        return np.exp(p - f) * self.k / eta

    def f2(self, eta):
        return self.f12(eta)[1]

    def f12(self, eta):
        p, f = self._s(eta)
        s = np.exp(p - f)
        k = self.k
        return s * k / eta, s * k / (eta * eta) * (k * (1.0 - s) - 1.0)


class NoisyOr(Family):
    """log(1 - exp(-eta)) per anomalous pair: eta = -log P(pair i is normal)."""

    cap = 30.0

    def bind(self, rows) -> Rows:
        return _NoisyOrRows(len(rows))


class _NoisyOrRows(Rows):
    def __init__(self, n: int):
        self.n = n

    def take(self, sel):
        sel = np.asarray(sel)
        return _NoisyOrRows(int(np.count_nonzero(sel)) if sel.dtype == bool else len(sel))

    def f(self, eta):
        return np.log(-np.expm1(-eta))

    def ybound(self):
        return np.ones(self.n)

    def f1(self, eta):
        return 1.0 / np.expm1(eta)

    def f2(self, eta):
        h = np.sinh(np.minimum(eta, 700.0) / 2.0)
        return -1.0 / (4.0 * h * h)


class SparseGLM:
    """Columns X (csc, positive pairs x P), totals T, penalties; see the module docstring.

    forced: columns always active and unpenalized (the background). rank: tie-break order
    (lower wins). group: the element each column stands for (posteriors sum over a group).
    cap: per-column upper bound of theta (default the family's).
    """

    def __init__(self, family: Family, X: sp.csc_matrix, T: np.ndarray, pen: np.ndarray,
                 forced: np.ndarray, rank: np.ndarray, group: np.ndarray, cap: np.ndarray | None = None):
        self.family = family
        self.X = sp.csc_matrix(X)
        self.X.sort_indices()
        self.T = np.asarray(T, dtype=np.float64)
        self.pen = np.asarray(pen, dtype=np.float64)
        self.forced = np.asarray(forced, dtype=bool)
        self.rank = np.asarray(rank, dtype=np.float64)
        self.group = np.asarray(group, dtype=np.int64)
        P = self.X.shape[1]
        self.cap = np.full(P, family.cap) if cap is None else np.asarray(cap, dtype=np.float64)
        self.theta = np.zeros(P)
        self.eta = np.zeros(self.X.shape[0])
        self.all_rows = np.arange(self.X.shape[0])
        self.active: list[int] = []
        self.col_nnz = np.diff(self.X.indptr)

    def add_columns(self, X: sp.csc_matrix, T: np.ndarray, pen: np.ndarray, rank: np.ndarray,
                    group: np.ndarray, cap: np.ndarray) -> None:
        """Append candidate columns (all at theta 0): the model itself does not change."""
        if X.shape[1] == 0:
            return
        self.X = sp.hstack((self.X, sp.csc_matrix(X)), format="csc")
        self.X.sort_indices()
        self.T = np.concatenate((self.T, T))
        self.pen = np.concatenate((self.pen, pen))
        self.forced = np.concatenate((self.forced, np.zeros(X.shape[1], dtype=bool)))
        self.rank = np.concatenate((self.rank, rank))
        self.group = np.concatenate((self.group, group))
        self.cap = np.concatenate((self.cap, cap))
        self.theta = np.concatenate((self.theta, np.zeros(X.shape[1])))
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
        return self.X.indices[pos].astype(np.intp), self.X.data[pos], seg

    def best_theta(self, cols: np.ndarray, eta: np.ndarray | None = None, warm: bool = False,
                   need: np.ndarray | None = None):
        """For each column: (theta, gain) maximizing LL over that column alone, the other
        columns' contribution fixed at `eta` (default: the current model without the column).
        warm: start from the current theta (refits). need: per column, a gain below which the
        exact value does not matter (concave families: a column whose upper bound
        hi x dLL/dtheta(0) stays below it reports gain 0 without being maximized)."""
        cols = np.asarray(cols, dtype=np.int64)
        k = len(cols)
        if k == 0:
            return np.zeros(0), np.zeros(0)
        fam = self.family
        rows, x, seg = self._gather(cols)
        fr = fam.bind(rows)
        base = self.eta[rows] - x * self.theta[cols][seg] if eta is None else eta[rows]
        base = np.maximum(base, 1e-100)
        T = self.T[cols]
        # f1 <= y / (x theta) row by row, so the root lies below sum(y) / T
        Y = np.bincount(seg, weights=fr.ybound(), minlength=k)
        f0 = fr.f(base)

        def gain_at(th):
            return np.bincount(seg, weights=fr.f(base + x * th[seg]) - f0, minlength=k) - th * T

        cap = self.cap[cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            hi = np.where(T > 0, np.minimum(cap, Y / np.where(T > 0, T, 1.0)), cap)
        if not fam.concave and not warm:
            return self._best_on_grid(cols, fr, x, seg, base, T, hi, gain_at)
        if not fam.concave:  # a refit: climb from where the column is, never downhill
            now = np.minimum(self.theta[cols], hi)
            g_now = gain_at(now)
            cand = self._newton(np.arange(k), fr, x, seg, base, T, np.zeros(k), hi.copy(),
                                np.where(now > 0, now, hi / 2))
            better = gain_at(cand) > g_now
            theta = np.where(better, cand, now)
            return theta, np.maximum(gain_at(theta), 0.0)
        theta = np.zeros(k)
        g1_0 = np.bincount(seg, weights=x * fr.f1(base), minlength=k) - T
        live = g1_0 > 0
        if need is not None:  # concavity: gain(theta) <= theta g1(0) <= hi g1(0)
            live &= hi * g1_0 > need
        unbound = live & (hi >= cap)  # at the cap? possible only where the bound Y / T did not bind
        g1_cap = np.bincount(seg, weights=x * fr.f1(base + x * np.where(unbound, cap, 0.0)[seg]), minlength=k) - T
        at_cap = unbound & (g1_cap >= 0)
        theta[at_cap] = cap[at_cap]
        live &= ~at_cap
        start = self.theta[cols] if warm else hi / 2
        theta[live] = self._newton(np.flatnonzero(live), fr, x, seg, base, T, np.zeros(k), hi.copy(),
                                   np.where((start > 0) & (start < hi), start, hi / 2))[live]
        return theta, np.maximum(gain_at(theta), 0.0)

    def _newton(self, todo, fr: Rows, x, seg, base, T, lo, hi, th_all):
        """Safeguarded Newton on g1 = dLL/dtheta, decreasing within [lo, hi] around its root; a
        step leaving the bracket falls back to the geometric middle (or hi / 100 while lo = 0).
        fr: the family bound to the entries' rows."""
        k = len(T)
        for it in range(_NEWTON_STEPS):
            if todo.size == 0:
                break
            if it % 4 == 0:  # compact to the columns still moving
                lut = np.full(k, -1, dtype=np.int64)
                lut[todo] = np.arange(len(todo))
                sel = lut[seg] >= 0
                s_seg, s_x, s_fr, s_base = lut[seg[sel]], x[sel], fr.take(sel), base[sel]
                s_T, s_cols = T[todo], todo
                s_lo, s_hi, s_th = lo[todo], hi[todo], th_all[todo]
                alive = np.ones(len(todo), dtype=bool)
                m = len(todo)
            e = s_base + s_x * s_th[s_seg]
            g1, g2 = s_fr.f12(e)
            d1 = np.bincount(s_seg, weights=s_x * g1, minlength=m) - s_T
            d2 = np.bincount(s_seg, weights=s_x * s_x * g2, minlength=m)
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
        return th_all

    def _best_on_grid(self, cols, fr: Rows, x, seg, base, T, hi, gain_at, points: int = 12):
        """Non-concave families: the best of a log-spaced grid on (0, hi], refined by Newton
        between its neighbours when dLL/dtheta changes sign there."""
        k = len(cols)
        grid = np.geomspace(1e-7, 1.0, points)[None, :] * hi[:, None]  # k x points
        gains = np.stack([gain_at(grid[:, g]) for g in range(points)], axis=1)
        b = np.argmax(gains, axis=1)
        best = gains[np.arange(k), b]
        theta = np.where(best > 0, grid[np.arange(k), b], 0.0)
        lo = np.where(b > 0, grid[np.arange(k), np.maximum(b - 1, 0)], 0.0)
        up = grid[np.arange(k), np.minimum(b + 1, points - 1)]
        d1 = np.bincount(seg, weights=x * fr.f1(base + x * theta[seg]), minlength=k) - T
        todo = np.flatnonzero((best > 0) & (np.abs(d1) > 0))
        if todo.size:
            lo2 = np.where(d1 > 0, theta, lo)
            hi2 = np.where(d1 > 0, up, theta)
            refined = self._newton(todo, fr, x, seg, base, T, lo2.copy(), hi2.copy(), (lo2 + hi2) / 2)
            cand = theta.copy()
            cand[todo] = refined[todo]
            better = gain_at(cand) > gain_at(theta)
            theta = np.where(better, cand, theta)
        return theta, np.maximum(gain_at(theta), 0.0)

    # ---- the model ------------------------------------------------------------------------

    def loglik(self) -> float:
        return float(np.sum(self.family.f(np.maximum(self.eta, 1e-100), self.all_rows)) - self.theta @ self.T)

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

    def refit(self, sweeps: int = 50, tol: float = 1e-4) -> None:
        """Maximize LL over the forced and active columns, LL never decreasing. A few columns:
        projected Newton on all of them at once. Many (mostly disjoint, like noisy hosts):
        block coordinate ascent, the forced (background) columns one joint block, the active
        ones in groups without common positive pairs, each group maximized exactly."""
        forced = np.flatnonzero(self.forced)
        if len(forced) + len(self.active) <= _JOINT_MAX:
            self._joint(np.concatenate((forced, np.array(self.active, dtype=np.int64))), tol=tol)
            return
        groups = self._colors(self.active)
        cur = self.loglik()
        for _ in range(sweeps):
            if forced.size:
                self._joint(forced, tol=tol)
            for g in groups:
                th, _ = self.best_theta(g, warm=True)
                for j, v in zip(g.tolist(), th.tolist(), strict=True):
                    self._set(j, v)
            new = self.loglik()
            if new - cur <= tol:  # nats: far below any penalty
                break
            cur = new

    def _joint(self, cols: np.ndarray, steps: int = 40, tol: float = 1e-4) -> None:
        """Projected Newton over a few columns at once (damped where the Hessian is not
        negative definite), with a backtracking line search; only the rows they touch."""
        cols = np.asarray(cols, dtype=np.int64)
        if cols.size == 0:
            return
        if cols.size == 1:  # one column: the safeguarded one-dimensional search
            th, _ = self.best_theta(cols, warm=True)
            self._set(int(cols[0]), float(th[0]))
            return
        sub = self.X[:, cols]
        rows = np.unique(sub.indices)
        fr = self.family.bind(rows)
        Xa = sub[rows].toarray() if rows.size * len(cols) <= 4_000_000 else sub[rows]
        th = self.theta[cols].copy()
        rest = self.eta[rows] - Xa @ th
        T, cap = self.T[cols], self.cap[cols]

        def ll(t):
            e = rest + Xa @ t
            return (-np.inf if np.any(e <= 0) else float(fr.f(e).sum() - t @ T)), e

        cur, e = ll(th)
        for _ in range(steps):
            ee = np.maximum(e, 1e-100)
            g1, w2 = fr.f12(ee)
            g = Xa.T @ g1 - T
            H = Xa.T @ (Xa * w2[:, None]) if isinstance(Xa, np.ndarray) else (Xa.T @ sp.diags(w2) @ Xa).toarray()
            free = ((th > 0) | (g > 0)) & ~((th >= cap) & (g > 0))
            if not free.any():
                break
            Hf = H[np.ix_(free, free)]
            scale = max(float(np.abs(np.diag(Hf)).max()), 1e-300)
            top = float(np.linalg.eigvalsh(Hf).max()) if len(Hf) > 1 else float(Hf[0, 0])
            damp = max(0.0, top) + 1e-9 * scale  # make the model concave where it is not
            try:
                d = np.linalg.solve(Hf - damp * np.eye(len(Hf)), -g[free])
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
            done = val - cur <= tol
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
        return float(self.drop_gains(np.array([j]))[0])

    def drop_gains(self, cols: np.ndarray) -> np.ndarray:
        """drop_gain of several columns at once."""
        cols = np.asarray(cols, dtype=np.int64)
        rows, x, seg = self._gather(cols)
        e = np.maximum(self.eta[rows], 1e-100)
        e0 = np.maximum(e - x * self.theta[cols][seg], 1e-100)
        f = self.family.bind(rows).f
        return (np.bincount(seg, weights=f(e) - f(e0), minlength=len(cols))
                - self.theta[cols] * self.T[cols])

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

    def penalized(self) -> float:
        return self.loglik() - float(self.pen[self.active].sum()) if self.active else self.loglik()

    def exchange(self, cols: list[int]) -> None:
        """For each active column given: would the model do better without it, searching again
        among the other candidates? (One aggregate, a switch, against the several smaller
        elements it may stand for.) Keeps whichever model scores higher."""
        for j in cols:
            if j not in self.active:
                continue
            before = (self.theta.copy(), self.eta.copy(), list(self.active), self.penalized())
            self._set(j, 0.0)
            self.active.remove(j)
            self.refit()
            same = np.flatnonzero(self.group == self.group[j])
            # its parts share its pairs; a handful at most (beyond, its penalty wins anyway)
            mask = np.zeros(self.X.shape[0], dtype=bool)
            mask[self.X.indices[self.X.indptr[j]:self.X.indptr[j + 1]]] = True
            ptr, ind = self.X.indptr, self.X.indices
            apart = [c for c in np.flatnonzero(~self.forced & (self.col_nnz > 0))
                     if not mask[ind[ptr[c]:ptr[c + 1]]].any()]
            self.select(max_active=len(before[2]) + _EXCHANGE_PARTS, exclude=set(same.tolist()) | set(apart))
            if self.penalized() < before[3] - 1e-9:
                self.theta, self.eta, self.active = before[0], before[1], before[2]

    def try_replace(self, remove: list[int], candidates: list[int]) -> bool:
        """Replace the active columns `remove` by the best of `candidates` (several links of one
        switch by the switch), search on, and keep the result if it scores higher."""
        remove = [j for j in remove if j in self.active]
        cand = np.array([c for c in candidates if c not in self.active], dtype=np.int64)
        if not remove or cand.size == 0:
            return False
        before = (self.theta.copy(), self.eta.copy(), list(self.active), self.penalized())
        for j in remove:
            self._set(j, 0.0)
            self.active.remove(j)
        self.refit()
        th, gain = self.best_theta(cand)
        b = int(np.argmax(gain - self.pen[cand]))
        if gain[b] <= 0:
            self.theta, self.eta, self.active = before[0], before[1], before[2]
            return False
        self._set(int(cand[b]), float(th[b]))
        self.active.append(int(cand[b]))
        self.refit()
        self.select(max_active=len(before[2]) + _EXCHANGE_PARTS)
        if self.penalized() < before[3] - 1e-9:
            self.theta, self.eta, self.active = before[0], before[1], before[2]
            return False
        return True

    def scan(self, cand: np.ndarray, shortlist: int = 32, eta: np.ndarray | None = None):
        """best_theta of many candidates. A family without concavity has a concave proxy (the
        plain Poisson for the burst model): the proxy ranks every candidate and only its
        shortlist is maximized exactly; the others score 0."""
        proxy = getattr(self.family, "proxy", None)
        need = self.pen[cand] if eta is None else None  # selection: below the penalty is no pick
        if proxy is None or len(cand) <= shortlist:
            return self.best_theta(cand, eta=eta, need=need if self.family.concave else None)
        own = self.family
        self.family = proxy
        try:
            score = self._proxy_scores(cand, shortlist, eta, need)
        finally:
            self.family = own
        top = np.argsort(-score, kind="stable")[:shortlist]
        th = np.zeros(len(cand))
        gain = np.zeros(len(cand))
        th[top], gain[top] = self.best_theta(cand[top], eta=eta)
        return th, gain

    def _proxy_scores(self, cand: np.ndarray, shortlist: int, eta, need) -> np.ndarray:
        """gain - pen of the (concave) family for every candidate that can be among the
        `shortlist` best, -inf for the others. Concavity bounds each gain by hi x dLL/dtheta(0)
        (one pass over the entries); the searches run best bound first and stop once the
        shortlist's worst exceeds every bound left, so the shortlist is the one every search
        would give."""
        ub = self._gain_bounds(cand, eta, need)
        pen = self.pen[cand]
        score = np.full(len(cand), -np.inf)
        zero = ub <= 0  # no search: the gain is 0
        score[zero] = -pen[zero]
        order = np.flatnonzero(~zero)
        order = order[np.argsort(-(ub[order] - pen[order]), kind="stable")]
        bound = ub[order] - pen[order]
        done, step = 0, 2 * shortlist
        while done < len(order):
            part = order[done:done + step]
            _, g = self.best_theta(cand[part], eta=eta, need=None if need is None else need[part])
            score[part] = g - pen[part]
            done += len(part)
            step *= 2
            if done < len(order):
                kth = np.partition(score[np.isfinite(score)], -shortlist)[-shortlist] \
                    if np.count_nonzero(np.isfinite(score)) >= shortlist else -np.inf
                rest = bound[done]  # the largest bound left
                if kth > rest + 1e-9 * (1.0 + abs(rest)):
                    break
        return score

    def _gain_bounds(self, cols: np.ndarray, eta, need) -> np.ndarray:
        """Per column, an upper bound of what best_theta (concave family) gains: hi x
        dLL/dtheta(0); exactly 0 where best_theta does not search (no ascent, or below need)."""
        k = len(cols)
        rows, x, seg = self._gather(cols)
        fr = self.family.bind(rows)
        base = self.eta[rows] - x * self.theta[cols][seg] if eta is None else eta[rows]
        base = np.maximum(base, 1e-100)
        T = self.T[cols]
        Y = np.bincount(seg, weights=fr.ybound(), minlength=k)
        cap = self.cap[cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            hi = np.where(T > 0, np.minimum(cap, Y / np.where(T > 0, T, 1.0)), cap)
        g1_0 = np.bincount(seg, weights=x * fr.f1(base), minlength=k) - T
        live = g1_0 > 0
        if need is not None:
            live &= hi * g1_0 > need
        return np.where(live, hi * g1_0, 0.0)

    def select(self, max_active: int = 256, batch: int = 64, exclude: set[int] | None = None) -> None:
        """Forward selection with refit (disjoint candidates in batches), then backward pruning."""
        pool = np.flatnonzero(~self.forced & (self.col_nnz > 0))
        if exclude:
            pool = pool[~np.isin(pool, np.array(sorted(exclude), dtype=np.int64))]
        while len(self.active) < max_active:
            cand = np.setdiff1d(pool, self.active, assume_unique=True)
            if cand.size == 0:
                break
            th, gain = self.scan(cand)
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
        """Drop active columns that no longer pay their penalty: the weakest first, with any
        weak ones that share no positive pair with it (their drops are independent)."""
        while self.active:
            act = np.array(self.active, dtype=np.int64)
            drops = self.drop_gains(act) - self.pen[act]
            weak = np.flatnonzero(drops <= 0)
            if weak.size == 0:
                break
            taken = np.zeros(self.X.shape[0], dtype=bool)
            ptr, ind = self.X.indptr, self.X.indices
            gone = []
            for w in weak[np.argsort(drops[weak], kind="stable")]:
                rows = ind[ptr[act[w]]:ptr[act[w] + 1]]
                if taken[rows].any():
                    continue
                taken[rows] = True
                gone.append(int(act[w]))
            for j in gone:
                self._set(j, 0.0)
                self.active.remove(j)
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
        _, gain = self.scan(cand, eta=eta)
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
        f = self.family.bind(rows).f
        ll = np.sum(f(base + x * th)) - th * self.T[j]
        llf = np.sum(f(base + x * floor)) - floor * self.T[j]
        z = np.sqrt(max(0.0, 2.0 * (ll - llf)))
        from math import erf, sqrt

        p = 0.5 * (1.0 + erf(z / sqrt(2.0)))
        return p if th >= floor else 1.0 - p

    def support(self, j: int, share: float = 0.5) -> int:
        """Positive pairs that column j explains for the most part (its share of eta >= share)."""
        a, b = self.X.indptr[j], self.X.indptr[j + 1]
        rows, x = self.X.indices[a:b], self.X.data[a:b]
        return int(np.count_nonzero(x * self.theta[j] >= share * self.eta[rows]))
