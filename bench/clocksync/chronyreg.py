"""Baseline: a chrony-style estimator on the same probe traces.

chrony turns each NTP exchange (t1 client send, t2 server receive, t3 server send, t4 client
receive) into an offset sample ((t2 − t1) + (t3 − t4)) / 2 and a delay (t4 − t1) − (t3 − t2),
then fits offset against time by a weighted linear regression in which a sample's variance
grows with its distance above the smallest delay: var ∝ (1 + (dᵢ − d_min) / sd)², dᵢ = delay/2,
sd = (median d − d_min) / SD_TO_DIST_RATIO (sourcestats.c). Here every forward packet is paired
with the nearest reverse packet in time to make an exchange, and all exchanges of the window
are regressed (chrony keeps at most 64; using all of them only helps the baseline).
"""

from __future__ import annotations

import numpy as np

from agent.clocksync.trace import Trace

SD_TO_DIST_RATIO = 0.7


def chrony_estimate(trace: Trace) -> dict:
    fwd = trace.fwd
    t_a = trace.a_time - np.int64(trace.t_ref_ns)  # ns from t_ref, int64
    y = trace.rx - trace.tx
    yf, tf = y[fwd], t_a[fwd]
    yr, tr = y[~fwd], t_a[~fwd]
    order = np.argsort(tr)
    yr, tr = yr[order], tr[order]
    j = np.clip(np.searchsorted(tr, tf), 1, tr.size - 1)
    nearer = np.where(np.abs(tr[j - 1] - tf) <= np.abs(tr[j] - tf), j - 1, j)
    base = int(np.median(yf))
    off = ((yf - base) - (yr[nearer] + base)).astype(np.float64) / 2  # (θ − base) per exchange
    delay = (yf + yr[nearer]).astype(np.float64)
    t = (tf + tr[nearer]).astype(np.float64) / 2 / 1e9
    dist = delay / 2
    dmin = dist.min()
    sd = max((np.median(dist) - dmin) / SD_TO_DIST_RATIO, 1e-9)
    weight = 1.0 / (1.0 + (dist - dmin) / sd) ** 2
    design = np.column_stack([np.ones_like(t), t])
    sw = np.sqrt(weight)
    coef, *_ = np.linalg.lstsq(design * sw[:, None], off * sw, rcond=None)
    return {"offset_ns": float(coef[0]) + base, "drift_ppm": float(coef[1]) / 1e3, "samples": int(off.size)}
