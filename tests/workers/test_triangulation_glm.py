"""The sparse GLM engine (workers/triangulation/glm.py): one-dimensional maxima against a
bounded scalar optimizer, selection of planted columns, ties to the lower rank, posteriors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

from workers.triangulation.glm import NoisyOr, Poisson, PoissonBurst, SparseGLM


def _families(n, rng):
    k = rng.integers(1, 6, n).astype(float)
    return {
        "poisson": (Poisson(k), 4000.0, 1.0),
        "burst": (PoissonBurst(k, np.full(n, 1000.0), 0.01, 0.5), 4000.0, 1.0),
        "noisy-or": (NoisyOr(), 40.0, NoisyOr.cap),
    }


@pytest.mark.parametrize("name", ["poisson", "burst", "noisy-or"])
def test_best_theta_is_the_maximum_of_the_column_alone(name):
    rng = np.random.default_rng(0)
    n, P = 300, 25
    family, scale, cap = _families(n, rng)[name]
    X = sp.random(n, P, density=0.2, random_state=1, format="csc")
    X.data = np.minimum(X.data * 2, 1.0)
    T = rng.random(P) * scale
    if name == "noisy-or":
        T[3] = 0.0  # every covered pair anomalous: theta goes to the cap
    glm = SparseGLM(family, X, T, np.zeros(P), np.zeros(P, bool), np.zeros(P), np.arange(P), np.full(P, cap))
    glm.eta[:] = rng.random(n) * 0.01 + 1e-4
    theta, gain = glm.best_theta(np.arange(P))
    rows = np.arange(n)
    for j in range(P):
        col = X[:, j].toarray().ravel()
        m = rows[col > 0]

        def neg(t, col=col, m=m, j=j):
            return -(np.sum(family.f(glm.eta[m] + col[m] * t, m) - family.f(glm.eta[m], m)) - t * T[j])

        # the reference: a fine grid, then a bounded search around its best point
        grid = np.concatenate(([0.0], np.geomspace(1e-9, cap, 400)))
        vals = [-neg(t) for t in grid]
        b = int(np.argmax(vals))
        ref = minimize_scalar(neg, bounds=(grid[max(b - 1, 0)], grid[min(b + 1, len(grid) - 1)]),
                              method="bounded", options={"xatol": 1e-12})
        best = max(0.0, -ref.fun, vals[b])
        assert gain[j] == pytest.approx(best, rel=1e-5, abs=1e-6)


def test_a_burst_explains_a_lone_pair_but_not_losses_many_pairs_share():
    # one pair lost 6 of 1000 probes; a column through it alone gains much less with bursts
    # allowed than without; a column through 40 pairs each losing 1-2 keeps most of its gain
    rng = np.random.default_rng(5)
    n = 41
    k = np.r_[6.0, rng.integers(1, 3, 40).astype(float)]
    lone = np.zeros((n, 1))
    lone[0] = 1.0
    shared = np.zeros((n, 1))
    shared[1:] = 1.0
    gains = {}
    for fam_name, fam in (("poisson", Poisson(k)), ("burst", PoissonBurst(k, np.full(n, 1000.0), 0.005, 0.5))):
        for col_name, col, T in (("lone", lone, 1000.0), ("shared", shared, 40000.0)):
            glm = SparseGLM(fam, sp.csc_matrix(col), np.array([T]), np.zeros(1), np.zeros(1, bool), np.zeros(1),
                            np.zeros(1), np.ones(1))
            glm.eta[:] = 2e-5
            gains[fam_name, col_name] = float(glm.best_theta(np.array([0]))[1][0])
    assert gains["burst", "lone"] < 0.5 * gains["poisson", "lone"]
    assert gains["burst", "shared"] > 0.7 * gains["poisson", "shared"]


def planted(n=2000, seed=3):
    """Poisson counts from a background column and columns 2 and 5 of twelve."""
    rng = np.random.default_rng(seed)
    sent = np.full(n, 1000.0)
    X = (rng.random((n, 12)) < 0.05).astype(float)
    X[:, 7] = X[:, 2]  # an exact twin of a planted column, with a worse rank
    rate = 1e-5 + X[:, 2] * 0.02 + X[:, 5] * 0.01
    k = rng.poisson(sent * rate)
    pos = np.flatnonzero(k > 0)
    cols = np.hstack((np.ones((n, 1)), X))
    T = sent @ cols
    glm = SparseGLM(Poisson(k[pos].astype(float)), sp.csc_matrix(cols[pos]), T, np.r_[0.0, np.full(12, 15.0)],
                    np.r_[True, np.zeros(12, bool)], np.r_[-1.0, np.arange(12.0)], np.arange(13), np.ones(13))
    glm.start(np.array([1e-5]))
    return glm


def test_selection_finds_the_planted_columns_and_their_rates():
    glm = planted()
    glm.select()
    assert sorted(glm.active) == [3, 6]  # columns 2 and 5, after the background column
    assert glm.theta[3] == pytest.approx(0.02, rel=0.1)
    assert glm.theta[6] == pytest.approx(0.01, rel=0.15)


def test_a_column_no_pair_can_tell_from_another_shares_the_posterior():
    glm = planted()
    glm.select()
    # column 2 (index 3) and its twin 7 (index 8) are identical: each is half the evidence
    glm.group = np.arange(13)
    assert glm.posterior(3) == pytest.approx(0.5, abs=0.01)
    assert glm.posterior(6) > 0.99
    glm.group[8] = glm.group[3]  # the same element in two columns: all of it
    assert glm.posterior(3) > 0.99
