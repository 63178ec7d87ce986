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
from scipy.special import log_ndtr

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
    pure_prior: float = 0.01  # pseudo-counts (fraction of a direction's points) for its pure weight


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
    """(centre, scale) of the narrow core of ``x`` (the pure pairs), beside a broad background.

    Under load most pairs are disturbed, so a MAD would measure the queueing, not the
    timestamp noise. A small EM separates a narrow Gaussian (started on the densest tenth of
    the points: the central 10 % of a Gaussian spans ±0.126 σ) from a broad Gaussian and a
    uniform floor.
    """
    if x.size == 0:
        return 0.0, floor
    xs = np.sort(x.astype(np.float64))
    h = max(3, xs.size // 10)
    if xs.size < 20:
        centre = float(np.median(xs))
        return centre, max(1.4826 * float(np.median(np.abs(xs - centre))), floor / k)
    widths = xs[h - 1:] - xs[: xs.size - h + 1]
    j = int(np.argmin(widths))
    mu = float(np.median(xs[j: j + h]))
    sig = max(float(widths[j]) / 2 / 0.1257, floor / k)
    wide = max(1.4826 * float(np.median(np.abs(xs - mu))), 3 * sig)
    span = float(xs[-1] - xs[0]) + 1.0
    w = np.array([0.3, 0.6, 0.1])
    for _ in range(60):
        logs = np.stack([np.log(w[0]) + _gauss_logpdf(xs - mu, sig), np.log(w[1]) + _gauss_logpdf(xs - mu, wide),
                         np.full(xs.size, np.log(w[2]) - np.log(span))])
        resp = np.exp(logs - logsumexp(logs, axis=0))
        w = np.clip(resp.mean(axis=1), 1e-4, None)
        w /= w.sum()
        r0 = resp[0]
        total = float(r0.sum())
        if total < 3:
            break
        mu = float(np.sum(r0 * xs) / total)
        new_sig = max(math.sqrt(float(np.sum(r0 * (xs - mu) ** 2)) / total), floor / k)
        wide = max(math.sqrt(float(np.sum(resp[1] * (xs - mu) ** 2)) / max(float(resp[1].sum()), 1e-9)), 2 * new_sig)
        if abs(new_sig - sig) <= 1e-6 * sig:
            sig = new_sig
            break
        sig = new_sig
    return mu, sig


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


def logsumexp(a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """log Σ exp(a), stable; scipy's has array-API overhead that dominates the small fits here."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis) if axis is not None else out.reshape(())


def _exgauss_logpdf(x: np.ndarray, s: float, beta: float) -> np.ndarray:
    """log density of N(0, s²) + Exp(mean β)."""
    return -math.log(beta) + s * s / (2 * beta * beta) - x / beta + log_ndtr(x / s - s / beta)


def _gauss_logpdf(x: np.ndarray, s: float) -> np.ndarray:
    return -0.5 * (x / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)


class _Mixture:
    """Negative log-likelihood of both directions' residuals around a shared line.

    Per direction the height above the delay floor is pure noise N(0, s²) (no queueing) or
    that noise plus a queue wait drawn from one of two exponentials (short waits and long ones:
    a single exponential cannot follow both a lightly loaded queue and a congestion episode),
    with a thin uniform floor for anything else. Parameters, scaled to O(1): θ₀/s0, γ·T/s0,
    d/s0, then per direction log(s/s0), two logits of the mixture weights (against the pure
    weight), log(β₁/s0) and log(β₂/β₁ − 1).
    """

    PER_DIR = 5

    def __init__(self, t_s, u, fwd, s0, outlier_weight, pure_prior=0.0):
        self.pure_prior = pure_prior
        self.t_scale = max(float(np.max(np.abs(t_s))), 1e-9)
        self.t = t_s / self.t_scale
        self.u = u / s0
        self.sign = np.where(fwd, 1.0, -1.0)
        self.masks = (fwd, ~fwd)
        self.s0 = s0
        span = float(np.ptp(self.u)) + 10.0
        self.log_floor = math.log(outlier_weight / span)
        self.log_main = math.log1p(-outlier_weight)

    def unpack(self, p: np.ndarray, k: int) -> tuple[float, np.ndarray, float, float]:
        ls, l1, l2, lb, lr = p[3 + self.PER_DIR * k: 3 + self.PER_DIR * (k + 1)]
        logits = np.array([0.0, l1, l2])
        log_w = logits - logsumexp(logits)
        beta1 = math.exp(lb)
        return math.exp(ls), log_w, beta1, beta1 * (1.0 + math.exp(lr))

    def nll(self, p: np.ndarray) -> float:
        return self.nll_grad(p)[0]

    def nll_grad(self, p: np.ndarray) -> tuple[float, np.ndarray]:
        """The negative log-likelihood and its analytic gradient."""
        x = self.u - self.sign * (p[0] + p[1] * self.t) - p[2]
        total = 0.0
        grad = np.zeros_like(p)
        dl_dx = np.zeros_like(x)
        for k, mask in enumerate(self.masks):
            if not mask.any():
                continue
            s, log_w, beta1, beta2 = self.unpack(p, k)
            xm = x[mask]
            g = [log_w[0] + _gauss_logpdf(xm, s)]
            parts = []
            for beta in (beta1, beta2):
                z = xm / s - s / beta
                lnd = log_ndtr(z)
                mills = np.exp(-0.5 * z * z - 0.5 * math.log(2 * math.pi) - lnd)
                g.append(-math.log(beta) + s * s / (2 * beta * beta) - xm / beta + lnd)
                parts.append((beta, mills))
            g[1] = g[1] + log_w[1]
            g[2] = g[2] + log_w[2]
            g = np.stack(g)
            lse = logsumexp(g, axis=0)
            ll = np.logaddexp(self.log_main + lse, self.log_floor)
            total -= float(np.sum(ll))
            weight = np.exp(self.log_main + lse - ll)  # share of the point the main mixture explains
            resp = np.exp(g - lse) * weight  # ∂ll/∂g_c
            # ∂g/∂x and ∂g/∂s per component
            gx = [-xm / (s * s)]
            gs = [xm * xm / s**3 - 1.0 / s]
            gb = []
            for beta, mills in parts:
                gx.append(-1.0 / beta + mills / s)
                gs.append(s / beta**2 + mills * (-xm / (s * s) - 1.0 / beta))
                gb.append(-1.0 / beta - s * s / beta**3 + xm / beta**2 + mills * s / beta**2)
            dl_dx[mask] = sum(resp[c] * gx[c] for c in range(3))
            o = 3 + self.PER_DIR * k
            grad[o] = -float(np.sum(sum(resp[c] * gs[c] for c in range(3)))) * s
            w = np.exp(log_w)
            rsum = resp.sum(axis=1)
            tot = weight.sum()
            grad[o + 1] = -float(rsum[1] - w[1] * tot)
            grad[o + 2] = -float(rsum[2] - w[2] * tot)
            # A weak prior on the pure weight (pseudo-counts): when queue waits are no longer than
            # the noise, the likelihood alone can slide the pure band down under a wall of
            # "queued" points; a FIFO with any idle time has pure packets.
            n_dir = xm.size * self.pure_prior
            total -= n_dir * float(log_w[0])
            grad[o + 1] += n_dir * w[1]
            grad[o + 2] += n_dir * w[2]
            d_b1 = float(np.sum(resp[1] * gb[0]))
            d_b2 = float(np.sum(resp[2] * gb[1]))
            grad[o + 3] = -(d_b1 * beta1 + d_b2 * beta2)
            grad[o + 4] = -(d_b2 * (beta2 - beta1))
        # x = u − sign·(θ + γt) − d
        grad[0] = float(np.sum(dl_dx * self.sign))
        grad[1] = float(np.sum(dl_dx * self.sign * self.t))
        grad[2] = float(np.sum(dl_dx))
        return total, grad


def _full_hessian(model: _Mixture, x: np.ndarray, step: float = 1e-4) -> np.ndarray:
    """Hessian of the NLL, by central differences of the analytic gradient."""
    h = np.zeros((x.size, x.size))
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = step
        h[:, i] = (model.nll_grad(x + e)[1] - model.nll_grad(x - e)[1]) / (2 * step)
    return (h + h.T) / 2


def _refine(t_s, u, fwd, theta_lp, gamma_lp, d_lp, s_dir, config):
    """The mixture fit; returns (θ₀, γ, d, sigma_θ₀, details) in ns, ns/s, ns, ns.

    ``s_dir`` is each direction's noise scale measured by the coded pairs: the fit may move it
    only within a factor of four, so the Gaussian cannot swallow the queue waits.
    """
    sign = np.where(fwd, 1.0, -1.0)
    resid = u - sign * (theta_lp + gamma_lp * t_s) - d_lp  # ≥ about 0: height above the margin
    init_dir = []
    for mask, s_meas in zip((fwd, ~fwd), s_dir, strict=True):
        r = resid[mask]
        mode = _half_sample_mode(r) if r.size >= 4 else float(np.median(r))
        above = r[r > mode + 3 * s_meas]
        beta = max(float(np.median(above - mode)) if above.size else 3 * s_meas, 2 * s_meas)
        frac_pure = float(np.clip(np.mean(np.abs(r - mode) <= 2 * s_meas) / 0.95, 0.05, 0.95))
        init_dir.append((mode, s_meas, frac_pure, beta))
    (cf, sf, pf, bf), (cr, sr, pr, br) = init_dir
    s0 = max(min(sf, sr), 1e-3)
    model = _Mixture(t_s, u, fwd, s0, config.outlier_weight, config.pure_prior)
    x0 = [(theta_lp + (cf - cr) / 2) / s0, gamma_lp * model.t_scale / s0, (d_lp + (cf + cr) / 2) / s0]
    bounds = [(None, None)] * 3
    for s, pure, beta in ((sf, pf, bf), (sr, pr, br)):
        q = (1 - pure) / 2
        x0 += [math.log(s / s0), math.log(q / pure), math.log(q / pure), math.log(beta / 3 / s0), math.log(8.0)]
        bounds += [(math.log(s / s0 / 4), math.log(4 * s / s0)), (-12, 12), (-12, 12),
                   (math.log(0.05), math.log(1e7)), (-3, 12)]
    x0 = np.array(x0)
    res = optimize.minimize(model.nll_grad, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                            options={"maxiter": 400, "ftol": 1e-10, "gtol": 1e-6})
    x = res.x
    theta, gamma, d = x[0] * s0, x[1] * s0 / model.t_scale, x[2] * s0
    # Uncertainty of θ₀ from the observed information at the optimum (all parameters: the
    # mixture's shape and the line trade off against each other).
    try:
        cov = np.linalg.pinv(_full_hessian(model, x))
        var = float(cov[0, 0])
        sigma = math.sqrt(var) * s0 if var > 0 and math.isfinite(var) else float("nan")
    except np.linalg.LinAlgError:
        sigma = float("nan")
    details = {"converged": bool(res.success), "iterations": int(res.nit), "evaluations": int(res.nfev), "message": str(res.message)}
    for k, name in enumerate(("ab", "ba")):
        s, log_w, b1, b2 = model.unpack(x, k)
        details[name] = {"noise_ns": s * s0, "pure_fraction": float(math.exp(log_w[0])),
                         "queue_ns": [b1 * s0, b2 * s0]}
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
    # Per-packet noise scale from the coded pairs: a gap error is the difference of two packets'
    # noise (four timestamps), so a packet's own noise is the gap scale / √2. Both directions
    # carry the same hosts' timestamps; a direction loaded so heavily that it has almost no
    # pure pairs cannot measure its own, so the smaller scale (the credible one) bounds both.
    gap_scales = {k: filter_stats[k]["gap_scale_ns"] for k in ("ab", "ba") if filter_stats[k]["pairs"] >= 20}
    s_point = max(min(gap_scales.values()) / math.sqrt(2) if gap_scales else 1.0, 0.5)
    s_dir = tuple(min(max(gap_scales.get(k, 0.0) / math.sqrt(2), s_point), 2 * s_point) for k in ("ab", "ba"))
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
                t_s[active], u[active], fwd[active], theta, gamma, d, s_dir, config)
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
