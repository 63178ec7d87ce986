"""The sparse GLM engine (workers/triangulation/glm.py): one-dimensional maxima against a
bounded scalar optimizer, selection of planted columns, ties to the lower rank, posteriors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

from workers.triangulation.glm import NOISY_OR, POISSON, SparseGLM


@pytest.mark.parametrize("family", [POISSON, NOISY_OR])
def test_best_theta_is_the_maximum_of_the_column_alone(family):
    rng = np.random.default_rng(0)
    n, P = 300, 25
    X = sp.random(n, P, density=0.2, random_state=1, format="csc")
    X.data = np.minimum(X.data * 2, 1.0)
    y = rng.integers(1, 6, n).astype(float) if family is POISSON else np.ones(n)
    T = rng.random(P) * (4000 if family is POISSON else 40)
    if family is NOISY_OR:
        T[3] = 0.0  # every covered pair anomalous: theta goes to the cap
    glm = SparseGLM(family, y, X, T, np.zeros(P), np.zeros(P, bool), np.zeros(P), np.arange(P))
    glm.eta[:] = rng.random(n) * 0.01 + 1e-4
    theta, gain = glm.best_theta(np.arange(P))
    for j in range(P):
        col = X[:, j].toarray().ravel()
        m = col > 0

        def neg(t, col=col, m=m, j=j):
            return -(np.sum(y[m] * (family.f(glm.eta[m] + col[m] * t) - family.f(glm.eta[m]))) - t * T[j])

        ref = minimize_scalar(neg, bounds=(0, family.cap), method="bounded", options={"xatol": 1e-12})
        assert gain[j] == pytest.approx(max(0.0, -ref.fun), rel=1e-6, abs=1e-6)
        assert theta[j] == pytest.approx(ref.x, rel=1e-4, abs=1e-6)


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
    glm = SparseGLM(POISSON, k[pos].astype(float), sp.csc_matrix(cols[pos]), T, np.r_[0.0, np.full(12, 15.0)],
                    np.r_[True, np.zeros(12, bool)], np.r_[-1.0, np.arange(12.0)], np.arange(13))
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
