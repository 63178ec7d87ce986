"""Per-pair clock estimation: offset and drift of B − A from one window of coded probes.

Model (A's clock is the time axis, t = 0 at ``t_ref_ns``)::

    forward  (A→B)  y = rx − tx = d + θ(t) + q + n
    reverse  (B→A)  y = rx − tx = d − θ(t) + q + n          θ(t) = θ₀ + γ·t

with d the one-way delay floor (assumed equal both ways: a constant path asymmetry is invisible
to any two-way method), q ≥ 0 queueing, n timestamp noise. Forward points lie above the line
θ(t) + d and negated reverse points below θ(t) − d; the line between them is the clock.

Three steps, each guarding the next:

1. **Coded-probe filter.** The two packets of a probe leave ``gap_ns`` apart; when the receive
   gap differs from the send gap by more than ``gap_k`` robust scales of that difference (the
   scale is learnt per direction from the trace itself, so it adapts to software or NIC
   timestamps), one packet was queued behind traffic the other was not: the pair is dropped.
2. **Max-margin fit (Huygens).** A linear program solved by HiGHS: maximise the margin d
   between the forward points and the negated reverse points, soft (a few points may cross,
   each paid for by a slack), which gives θ₀, γ, d. Points that cross the margin by far more
   than the timestamp noise are glitches: they are dropped and the LP solved again.
3. **Refinement.** The margin is set by the few lowest points, so its midline carries the noise
   of extreme values. Around it the pure points (no queueing) form a Gaussian band; queued
   points spread above it. A maximum-likelihood fit of that mixture per direction (Gaussian
   noise, plus the same noise convolved with an exponential queue, plus a thin uniform floor
   for what is neither), with θ₀ and γ shared by both directions, uses every pure point
   instead of the lowest few. Its observed information gives ``sigma_ns``. If it fails or
   wanders off the margin fit, the LP answer stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, sparse
from scipy.special import log_ndtr, logsumexp

from agent.clocksync.trace import ESTIMATE_FORMAT, Trace

NS_PER_S = 1e9


@dataclass(frozen=True)
class EstimatorConfig:
    gap_k: float = 4.0  # coded filter: reject |receive gap − send gap| beyond this many robust scales
    gap_floor_ns: float = 4.0  # ... but never tighter than this (integer-ns timestamps, quantized NIC clocks)
    min_pairs: int = 6  # per direction; with fewer accepted pairs every packet is used
    violator_frac: float = 0.02  # soft margin: about this fraction of points may cross it
    glitch_k: float = 10.0  # a point this many noise scales past the margin is a glitch
    refine: bool = True
    outlier_weight: float = 2e-3  # the uniform floor of the mixture


@dataclass
class Estimate:
    offset_ns: float
    drift_ppm: float
    min_owd_ns: float
    sigma_ns: float
    probes_used: int
    method: str  # "mixture" or "margin"
    details: dict = field(default_factory=dict)

    def to_document(self) -> dict:
        return {"format": ESTIMATE_FORMAT, "offset_ns": round(self.offset_ns, 3),
                "drift_ppm": round(self.drift_ppm, 6), "min_owd_ns": round(self.min_owd_ns, 3),
                "sigma_ns": round(self.sigma_ns, 3), "probes_used": int(self.probes_used)}


class EstimateError(ValueError):
    """The trace holds too little to estimate from (the message says what is missing)."""


# --- 1. coded-probe filter --------------------------------------------------------------------


def _robust_scale(x: np.ndarray, k: float, floor: float) -> tuple[float, float]:
    """(centre, scale) of the core of ``x``: MAD, re-estimated on the points within ``k`` scales."""
    if x.size == 0:
        return 0.0, floor
    centre = float(np.median(x))
    scale = max(1.4826 * float(np.median(np.abs(x - centre))), floor / k)
    for _ in range(20):
        inside = x[np.abs(x - centre) <= k * scale]
        if inside.size < 3:
            break
        new_centre = float(np.median(inside))
        new_scale = max(1.4826 * float(np.median(np.abs(inside - new_centre))), floor / k)
        if abs(new_scale - scale) <= 1e-6 * scale and new_centre == centre:
            break
        centre, scale = new_centre, new_scale
    return centre, scale


def coded_filter(trace: Trace, config: EstimatorConfig = EstimatorConfig()) -> tuple[np.ndarray, dict]:
    """Mask of the packets to fit: both packets of every pure pair (per direction).

    A direction with fewer than ``min_pairs`` accepted pairs keeps all its packets (a trace of
    single packets, or one where loss took most partners, is still estimable).
    """
    n = len(trace)
    keep = np.zeros(n, dtype=bool)
    order = np.lexsort((trace.seq, trace.probe_id))
    ids, seqs = trace.probe_id[order], trace.seq[order]
    first = np.flatnonzero((ids[:-1] == ids[1:]) & (seqs[:-1] == 0) & (seqs[1:] == 1))
    i0, i1 = order[first], order[first + 1]
    send_gap = trace.tx[i1] - trace.tx[i0]  # int64: exact
    recv_gap = trace.rx[i1] - trace.rx[i0]
    err = (recv_gap - send_gap).astype(np.float64)
    stats: dict = {}
    for name, is_fwd in (("ab", True), ("ba", False)):
        in_dir = trace.fwd[i0] == is_fwd
        e = err[in_dir]
        centre, scale = _robust_scale(e, config.gap_k, config.gap_floor_ns)
        threshold = max(config.gap_k * scale, config.gap_floor_ns)
        ok = np.abs(e - centre) <= threshold
        stats[name] = {"pairs": int(e.size), "accepted": int(ok.sum()), "gap_scale_ns": scale,
                       "threshold_ns": threshold}
        if ok.sum() >= config.min_pairs:
            keep[i0[in_dir][ok]] = True
            keep[i1[in_dir][ok]] = True
        else:
            keep[trace.fwd == is_fwd] = True
            stats[name]["fallback_all_packets"] = True
    return keep, stats


# --- 2. max-margin LP -----------------------------------------------------------------------


def _margin_lp(t_s: np.ndarray, u: np.ndarray, fwd: np.ndarray, violators: float) -> tuple[float, float, float]:
    """Soft max-margin line (θ₀ ns, γ ns/s, d ns) by HiGHS.

    Forward points must lie above θ₀ + γt + d, negated reverse points below θ₀ + γt − d
    (``u`` holds y − base for forward and y + base for reverse, so both constraints read
    ``±(θ₀ + γt) + d − ξ ≤ u``). Maximise d − C·Σξ with C = 1/violators: at the optimum about
    ``violators`` points cross the margin.
    """
    n = u.size
    sign = np.where(fwd, 1.0, -1.0)
    rows = np.repeat(np.arange(n), 4)
    cols = np.column_stack([np.zeros(n), np.ones(n), np.full(n, 2), 3 + np.arange(n)]).ravel()
    vals = np.column_stack([sign, sign * t_s, np.ones(n), -np.ones(n)]).ravel()
    a_ub = sparse.csr_matrix((vals, (rows, cols.astype(np.int64))), shape=(n, 3 + n))
    cost = np.concatenate([[0.0, 0.0, -1.0], np.full(n, 1.0 / violators)])
    bounds = [(None, None)] * 3 + [(0, None)] * n
    res = optimize.linprog(cost, A_ub=a_ub, b_ub=u, bounds=bounds, method="highs")
    if res.status != 0:
        raise EstimateError(f"the margin LP failed: {res.message}")
    theta0, gamma, d = res.x[:3]
    return float(theta0), float(gamma), float(d)


# --- 3. mixture refinement --------------------------------------------------------------------


def _half_sample_mode(x: np.ndarray) -> float:
    """Robust mode (Bickel's half-sample mode): repeatedly keep the densest half."""
    x = np.sort(x)
    while x.size > 3:
        h = (x.size + 1) // 2
        widths = x[h - 1:] - x[: x.size - h + 1]
        j = int(np.argmin(widths))
        x = x[j: j + h]
    return float(np.mean(x))


def _exgauss_logpdf(x: np.ndarray, s: float, beta: float) -> np.ndarray:
    """log density of N(0, s²) + Exp(mean β)."""
    return -math.log(beta) + s * s / (2 * beta * beta) - x / beta + log_ndtr(x / s - s / beta)


def _gauss_logpdf(x: np.ndarray, s: float) -> np.ndarray:
    return -0.5 * (x / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)


class _Mixture:
    """Negative log-likelihood of both directions' residuals around a shared line.

    Parameters (scaled so each is O(1)): θ₀/s0, γ·T/s0, d/s0, then per direction
    log(s/s0), logit p (pure fraction), log(β/s0).
    """

    def __init__(self, t_s, u, fwd, s0, outlier_weight):
        self.t = t_s / max(float(np.max(np.abs(t_s))), 1e-9)
        self.t_scale = max(float(np.max(np.abs(t_s))), 1e-9)
        self.u = u / s0
        self.sign = np.where(fwd, 1.0, -1.0)
        self.fwd = fwd
        self.s0 = s0
        span = float(np.ptp(self.u)) + 10.0
        self.log_floor = math.log(outlier_weight / span)
        self.log_main = math.log1p(-outlier_weight)

    def nll(self, p: np.ndarray) -> float:
        theta, gamma, d = p[0], p[1], p[2]
        x = self.u - self.sign * (theta + gamma * self.t) - d
        total = 0.0
        for k, mask in enumerate((self.fwd, ~self.fwd)):
            if not mask.any():
                continue
            ls, lp, lb = p[3 + 3 * k: 6 + 3 * k]
            s, beta = math.exp(ls), math.exp(lb)
            log_p = -np.logaddexp(0.0, -lp)
            log_q = -np.logaddexp(0.0, lp)
            xm = x[mask]
            main = np.logaddexp(log_p + _gauss_logpdf(xm, s), log_q + _exgauss_logpdf(xm, s, beta))
            total -= float(np.sum(np.logaddexp(self.log_main + main, self.log_floor)))
        return total


def _hessian(f, x: np.ndarray, steps: np.ndarray) -> np.ndarray:
    n = x.size
    h = np.zeros((n, n))
    f0 = f(x)
    for i in range(n):
        ei = np.zeros(n)
        ei[i] = steps[i]
        h[i, i] = (f(x + ei) - 2 * f0 + f(x - ei)) / steps[i] ** 2
        for j in range(i + 1, n):
            ej = np.zeros(n)
            ej[j] = steps[j]
            h[i, j] = h[j, i] = (f(x + ei + ej) - f(x + ei - ej) - f(x - ei + ej) + f(x - ei - ej)) / (
                4 * steps[i] * steps[j])
    return h


def _refine(t_s, u, fwd, theta_lp, gamma_lp, d_lp, s_point, config):
    """The mixture fit; returns (θ₀, γ, d, sigma_θ₀, details) in ns, ns/s, ns, ns."""
    sign = np.where(fwd, 1.0, -1.0)
    resid = u - sign * (theta_lp + gamma_lp * t_s) - d_lp  # ≥ about 0: height above the margin
    init_dir = []
    for mask in (fwd, ~fwd):
        r = resid[mask]
        if r.size < 4:
            init_dir.append((0.0, s_point, 0.5, 3 * s_point))
            continue
        mode = _half_sample_mode(r)
        below = r[r <= mode]
        s = max(float(np.sqrt(np.mean((below - mode) ** 2))) if below.size > 2 else s_point, 0.3 * s_point, 1e-3)
        above = r[r > mode + 3 * s]
        beta = max(float(np.mean(above - mode)) if above.size else 3 * s, 2 * s)
        frac_pure = float(np.clip(np.mean(np.abs(r - mode) <= 2 * s) / 0.95, 0.05, 0.95))
        init_dir.append((mode, s, frac_pure, beta))
    (cf, sf, pf, bf), (cr, sr, pr, br) = init_dir
    s0 = max(min(sf, sr), 1e-3)
    theta_init = theta_lp + (cf - cr) / 2
    d_init = d_lp + (cf + cr) / 2
    model = _Mixture(t_s, u, fwd, s0, config.outlier_weight)

    def logit(p):
        return math.log(p / (1 - p))

    x0 = np.array([theta_init / s0, gamma_lp * model.t_scale / s0, d_init / s0,
                   math.log(sf / s0), logit(pf), math.log(bf / s0),
                   math.log(sr / s0), logit(pr), math.log(br / s0)])
    res = optimize.minimize(model.nll, x0, method="L-BFGS-B",
                            options={"maxiter": 500, "ftol": 1e-12, "gtol": 1e-7})
    x = res.x
    theta, gamma, d = x[0] * s0, x[1] * s0 / model.t_scale, x[2] * s0
    steps = np.full(x.size, 1e-3)
    try:
        cov = np.linalg.inv(_hessian(model.nll, x, steps))
        var = float(cov[0, 0])
        sigma = math.sqrt(var) * s0 if var > 0 and math.isfinite(var) else float("nan")
    except np.linalg.LinAlgError:
        sigma = float("nan")
    details = {"converged": bool(res.success), "iterations": int(res.nit),
               "noise_ns": {"ab": math.exp(x[3]) * s0, "ba": math.exp(x[6]) * s0},
               "pure_fraction": {"ab": 1 / (1 + math.exp(-x[4])), "ba": 1 / (1 + math.exp(-x[7]))},
               "queue_mean_ns": {"ab": math.exp(x[5]) * s0, "ba": math.exp(x[8]) * s0}}
    return theta, gamma, d, sigma, details


# --- the estimator ----------------------------------------------------------------------------


def estimate(trace: Trace, config: EstimatorConfig = EstimatorConfig()) -> Estimate:
    """Offset (B − A at ``t_ref_ns``, ns), drift (ppm), one-way delay floor and uncertainty."""
    if not trace.fwd.any() or trace.fwd.all():
        raise EstimateError("a trace needs probes in both directions (ab and ba): one direction alone "
                            "cannot tell the clock offset from the delay")
    keep, filter_stats = coded_filter(trace, config)
    fwd = trace.fwd[keep]
    y = trace.rx[keep] - trace.tx[keep]  # int64, exact
    base = int(np.median(y[fwd]))  # integer base near θ + d, so the floats below are small
    u = np.where(fwd, y - base, y + base).astype(np.float64)
    t_s = (np.where(fwd, trace.tx[keep], trace.rx[keep]) - np.int64(trace.t_ref_ns)).astype(np.float64) / NS_PER_S
    if fwd.sum() < 2 or (~fwd).sum() < 2:
        raise EstimateError("fewer than two usable packets in one direction")
    # Per-packet noise scale from the coded pairs: a gap error is the difference of two packets' noise.
    gap_scales = [filter_stats[k]["gap_scale_ns"] for k in ("ab", "ba") if filter_stats[k]["pairs"] >= 3]
    s_point = max(float(np.median(gap_scales)) / math.sqrt(2) if gap_scales else 1.0, 0.5)

    active = np.ones(u.size, dtype=bool)
    glitches = 0
    for _ in range(4):
        n_active = int(active.sum())
        violators = max(2.0, config.violator_frac * n_active)
        theta, gamma, d = _margin_lp(t_s[active], u[active], fwd[active], violators)
        sign = np.where(fwd, 1.0, -1.0)
        height = u - sign * (theta + gamma * t_s) - d  # ≥ 0 on or above the margin
        glitch = active & (height < -config.glitch_k * s_point)
        if not glitch.any():
            break
        glitches += int(glitch.sum())
        active &= ~glitch
        if (fwd & active).sum() < 2 or (~fwd & active).sum() < 2:
            raise EstimateError("too few packets left after dropping timestamp glitches")
    # Rough uncertainty of the margin fit: the extremes' spread, both directions.
    sigma_lp = s_point / math.sqrt(2)
    result = Estimate(theta + base, gamma / 1e3, d, sigma_lp, int(active.sum()), "margin",
                      {"filter": filter_stats, "glitches": glitches, "noise_ns": s_point})
    if config.refine:
        try:
            r_theta, r_gamma, r_d, r_sigma, details = _refine(
                t_s[active], u[active], fwd[active], theta, gamma, d, s_point, config)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError, OverflowError) as exc:
            result.details["refine_failed"] = str(exc)
            return result
        # The refinement may only move the line within the band the margin leaves open.
        band = max(d, 0.0) + 10 * s_point
        ok = (math.isfinite(r_theta) and math.isfinite(r_gamma) and abs(r_theta - theta) <= band
              and math.isfinite(r_sigma))
        if ok:
            result = Estimate(r_theta + base, r_gamma / 1e3, r_d, r_sigma, int(active.sum()), "mixture",
                              {**result.details, **details})
        else:
            result.details["refine_rejected"] = {"offset_ns": r_theta + base, "sigma_ns": r_sigma}
    return result
