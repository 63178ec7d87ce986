"""The network effect: one consistent clock offset per node from noisy pairwise estimates.

Around any loop of the probe graph the true pairwise offsets sum to zero; measured ones do not.
With incidence matrix D (edge e = (a, b) has −1 at a, +1 at b) and measured offsets δ, the node
offsets x solve ``min Σ ρ((δ − Dx)ₑ / sₑ)`` with one node per connected component pinned to 0
(the graph's reference in its component). ρ is robust, in three stages:

1. **L1** (a linear program solved by HiGHS): immune to a few gross errors as long as loops
   outvote them; it gives the starting point.
2. **Tukey biweight IRLS** on *standardised* residuals zₑ = rₑ / (σₑ·√(1 − hₑ)·scale), hₑ the
   edge's leverage (its share of the fit: an edge in few loops has a small residual even when
   it is wrong), scale a robust estimate of how well the σ's describe the noise (never below
   1: a graph whose σ's are too large is not made to flag more). A redescending ρ gives a
   gross error no weight at all, where Huber still lets it pull. Its objective has local minima:
   a fit that leaves gross errors is tried again from a second L1 start in which no edge votes
   more than one of median σ (one over-precise stale estimate must not outvote a node's honest
   edges), and the fit with fewer gross errors is kept.
3. Edges with ``|z| > flag_k`` are **flagged** (a fault signal in itself: a bad pair estimate,
   a path that changed, asymmetric congestion) and left out of a final weighted least-squares
   solve, whose inverse normal matrix gives each node's uncertainty.

A bridge (an edge in no loop) has leverage 1: nothing can check it, and it is never flagged.
Nodes not connected to the reference are reported as disconnected, never guessed; each such
island is solved on its own, relative to its own reference (its first node), and reported
apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, sparse
from scipy.sparse import csgraph
from scipy.sparse.linalg import splu

from workers.clocksolve.graph import SOLUTION_FORMAT, Graph

DENSE_MAX_NODES = 3000  # beyond this, leverages and uncertainties come from a random sketch


@dataclass(frozen=True)
class SolverConfig:
    robust: str = "tukey"  # "tukey" (redescending, with flagging), "huber" or "none" (plain WLS)
    tukey_c: float = 4.685
    huber_k: float = 1.345
    flag_k: float = 8.0  # gross errors of interest are tens of σ; honest noise reaches 5–7 σ
    max_iter: int = 50
    sketch_k: int = 64
    seed: int = 0


@dataclass
class ComponentSolution:
    reference: int
    nodes: np.ndarray  # node indices
    offsets: np.ndarray  # per node in ``nodes``, relative to ``reference``
    sigmas: np.ndarray
    edges: np.ndarray  # edge indices
    residuals: np.ndarray  # per edge in ``edges``
    z: np.ndarray
    flagged: np.ndarray  # bool per edge in ``edges``
    scale: float
    drifts: np.ndarray | None = None
    drift_sigmas: np.ndarray | None = None


@dataclass
class Solution:
    graph: Graph
    main: ComponentSolution
    islands: list[ComponentSolution] = field(default_factory=list)

    @property
    def disconnected(self) -> list[str]:
        return sorted(self.graph.nodes[i] for isl in self.islands for i in isl.nodes)

    def to_document(self) -> dict:
        g = self.graph
        names = g.nodes

        def node_map(comp: ComponentSolution, values: np.ndarray, digits: int) -> dict:
            return {names[i]: round(float(v), digits) for i, v in zip(comp.nodes, values, strict=True)}

        residuals, flagged = [], []
        for comp in [self.main, *self.islands]:
            for e, r, z, f in zip(comp.edges, comp.residuals, comp.z, comp.flagged, strict=True):
                row = {"a": names[g.a[e]], "b": names[g.b[e]], "residual_ns": round(float(r), 3),
                       "z": round(float(z), 3) if math.isfinite(z) else None, "flagged": bool(f)}
                residuals.append(row)
                if f:
                    flagged.append({k: row[k] for k in ("a", "b", "residual_ns", "z")})
        doc = {
            "format": SOLUTION_FORMAT,
            "reference": g.reference,
            "offsets_ns": node_map(self.main, self.main.offsets, 3),
            "sigma_ns": node_map(self.main, self.main.sigmas, 3),
            "residuals_ns": residuals,
            "flagged": flagged,
            "disconnected": self.disconnected,
            "islands": [{"reference": names[isl.reference], "nodes": sorted(names[i] for i in isl.nodes),
                         "offsets_ns": node_map(isl, isl.offsets, 3), "sigma_ns": node_map(isl, isl.sigmas, 3)}
                        for isl in self.islands],
            "noise_scale": round(self.main.scale, 4),
        }
        if self.main.drifts is not None:
            doc["drift_ppm"] = node_map(self.main, self.main.drifts, 6)
            doc["drift_sigma_ppm"] = node_map(self.main, self.main.drift_sigmas, 6)
        return doc


# --- linear algebra on one component ----------------------------------------------------------


def _incidence(a_loc: np.ndarray, b_loc: np.ndarray, n: int) -> sparse.csr_matrix:
    m = a_loc.size
    rows = np.repeat(np.arange(m), 2)
    cols = np.column_stack([a_loc, b_loc]).ravel()
    vals = np.tile([-1.0, 1.0], m)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(m, n))


def _wls(dg: sparse.csr_matrix, w: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """x (with x[0] = 0) minimising Σ wₑ (δ − Dx)ₑ²; dg is D without the reference's column."""
    lap = (dg.T @ sparse.diags(w) @ dg).tocsc()
    rhs = dg.T @ (w * delta)
    x = splu(lap).solve(rhs)
    return np.concatenate([[0.0], x])


def _l1(dg: sparse.csr_matrix, w: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """x minimising Σ √wₑ |δ − Dx|ₑ (HiGHS): variables x, r⁺, r⁻ with Dx + r⁺ − r⁻ = δ."""
    m, n1 = dg.shape
    eye = sparse.identity(m, format="csr")
    a_eq = sparse.hstack([dg, eye, -eye], format="csr")
    cost = np.concatenate([np.zeros(n1), np.sqrt(w), np.sqrt(w)])
    bounds = [(None, None)] * n1 + [(0, None)] * (2 * m)
    res = optimize.linprog(cost, A_eq=a_eq, b_eq=delta, bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"the L1 solve failed: {res.message}")
    return np.concatenate([[0.0], res.x[:n1]])


def _covariance_parts(dg: sparse.csr_matrix, w: np.ndarray, a_loc, b_loc, config: SolverConfig):
    """(var of each node's offset, leverage of each edge) for weights w (reference at index 0).

    Exact from the inverse of the grounded Laplacian on small graphs; on large ones from a
    Johnson–Lindenstrauss sketch of effective resistances (var xᵢ is the resistance between i
    and the reference, hₑ = wₑ·R(a, b)).
    """
    m, n1 = dg.shape
    lap = (dg.T @ sparse.diags(w) @ dg).tocsc()
    if n1 == 0:
        return np.zeros(1), np.ones(m)
    if n1 <= DENSE_MAX_NODES:
        g = np.linalg.inv(lap.toarray())
        full = np.zeros((n1 + 1, n1 + 1))
        full[1:, 1:] = g
        var = np.diag(full).copy()
        res = full[a_loc, a_loc] + full[b_loc, b_loc] - 2 * full[a_loc, b_loc]
    else:
        rng = np.random.default_rng(config.seed)
        k = config.sketch_k
        q = rng.choice([-1.0, 1.0], size=(k, m)) / math.sqrt(k)
        rhs = (q * np.sqrt(w)) @ dg  # k × n1: Q W^½ D
        lu = splu(lap)
        z = np.column_stack([lu.solve(np.asarray(rhs[i]).ravel()) for i in range(k)])  # n1 × k
        z = np.vstack([np.zeros((1, k)), z])
        var = np.sum(z * z, axis=1)
        res = np.sum((z[a_loc] - z[b_loc]) ** 2, axis=1)
    lev = np.clip(w * res, 0.0, 1.0)
    return var, lev


def _irls(d, dg, delta, w0, denom, checkable, x, config: SolverConfig) -> tuple[np.ndarray, float]:
    """Iteratively reweighted least squares for Huber or Tukey from x: (x, noise scale)."""
    tolerance = 1e-6 * max(1.0, float(np.min(1.0 / np.sqrt(w0))))
    for _ in range(config.max_iter):
        zraw = _zraw(d, delta, denom, x)
        scale = _noise_scale(zraw, checkable)
        u = zraw / scale
        if config.robust == "huber":
            factor = np.where(np.abs(u) <= config.huber_k, 1.0, config.huber_k / np.maximum(np.abs(u), 1e-12))
        else:
            factor = np.where(np.abs(u) < config.tukey_c, (1 - (u / config.tukey_c) ** 2) ** 2, 0.0)
        factor = np.where(checkable, factor, 1.0)
        x_new = _wls(dg, w0 * np.maximum(factor, 1e-12), delta)
        moved = float(np.max(np.abs(x_new - x))) if x.size else 0.0
        x = x_new
        if moved <= tolerance:
            break
    return x, _noise_scale(_zraw(d, delta, denom, x), checkable)


def _zraw(d, delta, denom, x) -> np.ndarray:
    """Each edge's residual over its σ and leverage, before the noise scale."""
    return (delta - d @ x) / denom


def _noise_scale(zraw: np.ndarray, checkable: np.ndarray) -> float:
    """How well the σ's describe the noise (MAD of the checkable edges), never below 1."""
    core = np.abs(zraw[checkable])
    return max(1.4826 * float(np.median(core)), 1.0) if core.size else 1.0


def _tukey_objective(u: np.ndarray, c: float) -> float:
    """Σ ρ(u) of Tukey's biweight: each gross error costs c²/6 whatever its size or σ."""
    inside = np.minimum((u / c) ** 2, 1.0)
    return float(np.sum(c * c / 6.0 * (1.0 - (1.0 - inside) ** 3)))


def _solve_component(g: Graph, nodes: np.ndarray, ref: int, edges: np.ndarray, config: SolverConfig,
                     values: np.ndarray, sigmas: np.ndarray) -> ComponentSolution:
    order = np.concatenate([[ref], nodes[nodes != ref]])
    local = {int(v): i for i, v in enumerate(order)}
    a_loc = np.array([local[int(v)] for v in g.a[edges]], dtype=np.int64)
    b_loc = np.array([local[int(v)] for v in g.b[edges]], dtype=np.int64)
    n = order.size
    if edges.size == 0:
        return ComponentSolution(ref, order, np.zeros(1), np.zeros(1), edges, np.zeros(0), np.zeros(0),
                                 np.zeros(0, bool), 1.0)
    d = _incidence(a_loc, b_loc, n)
    dg = d[:, 1:].tocsr()
    delta = values[edges]
    sig = sigmas[edges]
    w0 = 1.0 / sig**2
    keep = np.ones(edges.size, dtype=bool)
    scale = 1.0
    _, lev = _covariance_parts(dg, w0, a_loc, b_loc, config)
    denom = sig * np.sqrt(np.clip(1.0 - lev, 1e-6, None))
    checkable = lev < 1.0 - 1e-6  # an edge in no loop cannot be checked
    if config.robust == "none":
        x = _wls(dg, w0, delta)
    else:
        x, scale = _irls(d, dg, delta, w0, denom, checkable, _l1(dg, w0, delta), config)
        if config.robust == "tukey":
            x, scale = _second_start_if_better(d, dg, delta, w0, sig, denom, checkable, x, scale, config)
            keep = ~(checkable & (np.abs(_zraw(d, delta, denom, x) / scale) > config.flag_k))
            x = _wls(dg, w0 * keep, delta) if keep.any() else x
    r = delta - d @ x
    z = np.where(checkable, r / denom / scale, np.nan)
    var, _ = _covariance_parts(dg, np.where(keep, w0, w0 * 1e-12), a_loc, b_loc, config)
    return ComponentSolution(ref, order, x, np.sqrt(np.maximum(var, 0.0)) * scale, edges, r, z, ~keep, scale)


def _second_start_if_better(d, dg, delta, w0, sig, denom, checkable, x, scale, config: SolverConfig):
    """Tukey's objective has local minima, and the σ-weighted L1 start can land in a wrong one: an
    edge that claims a σ far below the others' (a stale estimate from before a clock step, say)
    outvotes all of a node's honest edges, and the fit moves the node to agree with it. A wrong
    minimum leaves gross residuals, so only a fit that would flag edges is tried again, from an L1
    start where no edge votes more than one of median σ; the fit with fewer gross errors (lower
    objective, by more than half an edge's rejection cost c²/6, at the larger of the two noise
    scales) wins."""
    c = config.tukey_c
    if not np.any(checkable & (np.abs(_zraw(d, delta, denom, x) / scale) > config.flag_k)):
        return x, scale
    capped = np.minimum(w0, 1.0 / float(np.median(sig)) ** 2)
    if np.array_equal(capped, w0):
        return x, scale
    x2, scale2 = _irls(d, dg, delta, w0, denom, checkable, _l1(dg, capped, delta), config)
    common = max(scale, scale2)

    def objective(xs):
        return _tukey_objective(np.where(checkable, _zraw(d, delta, denom, xs) / common, 0.0), c)

    if objective(x2) < objective(x) - c * c / 12.0:
        return x2, scale2
    return x, scale


def solve(g: Graph, config: SolverConfig = SolverConfig()) -> Solution:
    """Per-node offsets (and drifts, when every edge carries one) relative to the reference."""
    n = len(g.nodes)
    adj = sparse.coo_matrix((np.ones(g.a.size), (g.a, g.b)), shape=(n, n))
    _, labels = csgraph.connected_components(adj, directed=False)
    ref = g.ref_index
    comps = []
    for label in np.unique(labels):
        nodes = np.flatnonzero(labels == label)
        comp_ref = ref if label == labels[ref] else int(nodes[0])
        edges = np.flatnonzero(labels[g.a] == label)
        sol = _solve_component(g, nodes, comp_ref, edges, config, g.offset_ns, g.sigma_ns)
        if g.drift_ppm is not None and edges.size:
            # Drifts obey the same loop law; solve them with the offsets' flags (the same bad pair).
            dsol = _solve_component(g, nodes, comp_ref, edges, SolverConfig(robust=config.robust),
                                    g.drift_ppm, g.drift_sigma_ppm)
            sol.drifts, sol.drift_sigmas = dsol.offsets, dsol.sigmas
        elif g.drift_ppm is not None:
            sol.drifts, sol.drift_sigmas = np.zeros(1), np.zeros(1)
        comps.append((label == labels[ref], sol))
    main = next(sol for is_main, sol in comps if is_main)
    return Solution(g, main, [sol for is_main, sol in comps if not is_main])
