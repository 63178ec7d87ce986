"""Synthetic probe traces with known truth, for tests and benchmarks of clock estimators.

Not a copy of any other generator: the queueing here is a simulated FIFO bottleneck per
direction (Lindley recursion over Poisson cross-traffic of exponential or Pareto packet sizes,
with ON/OFF congestion episodes), so the two packets of a coded probe see physically coupled
waits; timestamps carry Gaussian noise, occasional one-sided tails, optional interrupt
coalescing (software receive timestamps taken at the next poll) and rare gross glitches; the
clock of B runs with an offset, a drift and a random walk of its frequency.

``make_trace(profile, seed)`` returns ``(trace_document, truth)`` where ``truth`` has
``offset_ns`` (B − A at ``t_ref_ns`` on A's clock) and ``drift_ppm`` (mean rate of change of that
offset over the window).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

PROFILES = ("hw-idle", "hw-loaded", "hw-asym", "hw-bursty", "hw-glitch",
            "sw-idle", "sw-loaded", "sw-asym", "sw-bursty", "sw-glitch")


@dataclass(frozen=True)
class TraceParams:
    window_s: float = 2.0
    theta0_ns: float = 0.0
    drift_ppm: float = 0.0
    wander_ppm: float = 0.0  # std of the frequency random walk over the window
    owd_ns: float = 2000.0  # propagation + serialisation, both ways
    asym_ns: float = 0.0  # forward − reverse floor (invisible to two-way methods)
    rate_hz: tuple = (500.0, 500.0)  # probes per second per direction
    poisson: bool = False
    gap_ns: int = 10000
    send_jitter_ns: float = 20.0
    ts_sigma_ns: float = 20.0
    ts_tail_p: float = 0.0
    ts_tail_ns: float = 0.0
    coalesce_p: float = 0.0  # software receive: fraction of packets stamped at the next poll
    coalesce_ns: float = 0.0
    glitch_p: float = 0.0  # per timestamp
    glitch_ns: tuple = (1000.0, 100000.0)
    load: tuple = (0.1, 0.1)  # cross-traffic utilisation of each direction's bottleneck
    pkt_ns: tuple = (1200.0, 1200.0)  # mean cross-traffic service time
    pareto: tuple = (0.0, 0.0)  # fraction of cross-traffic packets drawn from a Pareto (bursts)
    episode_hz: tuple = (0.0, 0.0)  # congestion episodes per second
    episode_s: float = 0.05
    episode_load: float = 0.95
    loss: float = 0.0
    t_ref_frac: float = 1.0  # where t_ref lies in the window (0 start, 1 end; may exceed 1)


def draw_params(profile: str, rng: np.random.Generator) -> TraceParams:
    hw = profile.startswith("hw")
    kind = profile.split("-", 1)[1]
    u = rng.uniform
    p = TraceParams(
        theta0_ns=u(-50e6, 50e6), drift_ppm=u(-50, 50), wander_ppm=u(0, 0.01),
        owd_ns=u(1000, 5000) if hw else u(5000, 40000),
        rate_hz=(u(200, 800), u(200, 800)), poisson=bool(rng.integers(2)),
        gap_ns=int(u(5000, 20000)) if hw else int(u(20000, 50000)),
        send_jitter_ns=u(5, 50) if hw else u(100, 2000),
        ts_sigma_ns=u(3, 25) if hw else u(300, 3000),
        ts_tail_p=u(0, 0.005) if hw else u(0.01, 0.08),
        ts_tail_ns=u(30, 150) if hw else u(1000, 4000),
        coalesce_p=0.0 if hw else u(0, 0.3), coalesce_ns=u(5000, 30000),
        load=(u(0.02, 0.15),) * 2, pkt_ns=(u(100, 1200),) * 2 if hw else (u(1000, 12000),) * 2,
        pareto=(0.05, 0.05), loss=u(0, 0.003), t_ref_frac=float(rng.choice([1.0, 0.5, u(0, 1.2)])),
    )
    if kind == "loaded":
        p = replace(p, load=(u(0.4, 0.8), u(0.4, 0.8)), pareto=(0.1, 0.1), loss=u(0, 0.01))
    elif kind == "asym":
        heavy = u(0.6, 0.9)
        p = replace(p, load=(heavy, u(0.02, 0.1)) if rng.integers(2) else (u(0.02, 0.1), heavy),
                    rate_hz=(u(100, 800), u(100, 800)))
    elif kind == "bursty":
        p = replace(p, load=(u(0.2, 0.5), u(0.2, 0.5)), episode_hz=(u(1, 6), u(1, 6)),
                    episode_s=u(0.02, 0.15), episode_load=u(0.9, 0.99), pareto=(0.2, 0.2), loss=u(0, 0.02))
    elif kind == "glitch":
        p = replace(p, load=(u(0.1, 0.5), u(0.1, 0.5)), glitch_p=u(0.001, 0.01))
    return p


def _send_times(rate: float, window_ns: float, poisson: bool, rng) -> np.ndarray:
    if poisson:
        n = rng.poisson(rate * window_ns / 1e9)
        return np.sort(rng.uniform(0, window_ns, n))
    period = 1e9 / rate
    return np.arange(rng.uniform(0, period), window_ns, period)


def _queue_waits(arrivals: np.ndarray, window_ns: float, load: float, pkt_ns: float, pareto: float,
                 episode_hz: float, episode_s: float, episode_load: float, rng) -> np.ndarray:
    """Waiting time of each probe arrival in a FIFO fed by Poisson cross-traffic (Lindley)."""
    span = window_ns + 2e7  # start 20 ms early so the queue is in its stationary regime
    # Piecewise-constant utilisation: base load, with ON episodes at episode_load.
    edges, levels = [0.0], [load]
    if episode_hz > 0:
        t = 0.0
        while True:
            t += rng.exponential(1e9 / episode_hz)
            if t >= span:
                break
            dur = rng.exponential(episode_s * 1e9)
            edges += [t, min(t + dur, span)]
            levels += [episode_load, load]
            t += dur
    edges.append(span)
    cross = []
    for lo, hi, rho in zip(edges[:-1], edges[1:], levels, strict=True):
        if hi <= lo or rho <= 0:
            continue
        n = rng.poisson(rho / pkt_ns * (hi - lo))
        cross.append(rng.uniform(lo, hi, n))
    times = np.sort(np.concatenate(cross)) if cross else np.empty(0)
    sizes = rng.exponential(pkt_ns, times.size)
    big = rng.random(times.size) < pareto
    # Pareto (alpha 1.5) bursts with the same mean as the exponential sizes they replace.
    sizes[big] = pkt_ns / 3 * (rng.pareto(1.5, int(big.sum())) + 1)
    probe_t = arrivals + 2e7
    all_t = np.concatenate([times, probe_t])
    all_x = np.concatenate([sizes, np.full(probe_t.size, 1.0)])
    is_probe = np.concatenate([np.zeros(times.size, bool), np.ones(probe_t.size, bool)])
    order = np.argsort(all_t, kind="stable")
    all_t, all_x, is_probe = all_t[order], all_x[order], is_probe[order]
    # W_n = max(0, W_{n-1} + x_{n-1} − Δt): with S = cumsum(x_{n-1} − Δt), W = S − min(0, min S).
    steps = np.concatenate([[0.0], all_x[:-1] - np.diff(all_t)])
    s = np.cumsum(steps)
    w = s - np.minimum(0.0, np.minimum.accumulate(s))
    waits = np.empty(probe_t.size)
    waits[order[is_probe] - times.size] = w[is_probe]
    return waits


def make_trace(profile: str | TraceParams, seed: int, a: str = "nodeA", b: str = "nodeB"):
    rng = np.random.default_rng(seed)
    params = draw_params(profile, rng) if isinstance(profile, str) else profile
    window = params.window_s * 1e9
    epoch = int(1.8e18) + int(rng.integers(0, 10**15))
    # θ(t) = θ₀ + γt + ∫ (random-walk frequency); t on A's clock, ns from the window start.
    grid = np.linspace(-1e9, window + 2e9, 2001)
    walk = np.cumsum(rng.normal(0, 1, grid.size)) / math.sqrt(grid.size) * params.wander_ppm * 1e-6
    walk -= walk[np.searchsorted(grid, 0.0)]
    phase = np.concatenate([[0.0], np.cumsum((walk[1:] + walk[:-1]) / 2 * np.diff(grid))])
    phase -= np.interp(0.0, grid, phase)

    def theta(t):
        return params.theta0_ns + params.drift_ppm * 1e-6 * t + np.interp(t, grid, phase)

    probes = []
    rows = []
    for k, direction in enumerate(("ab", "ba")):
        sends = _send_times(params.rate_hz[k], window, params.poisson, rng)
        first = sends + rng.normal(0, params.send_jitter_ns, sends.size) * 0.1
        second = first + params.gap_ns + rng.normal(0, params.send_jitter_ns, sends.size)
        t_send = np.column_stack([first, second]).ravel()  # true (= A clock) send times
        waits = _queue_waits(t_send, window, params.load[k], params.pkt_ns[k], params.pareto[k],
                             params.episode_hz[k], params.episode_s, params.episode_load, rng)
        floor = params.owd_ns + (params.asym_ns / 2 if k == 0 else -params.asym_ns / 2)
        t_arr = t_send + floor + waits
        ids = np.repeat(np.arange(sends.size) * 2 + k, 2)
        seqs = np.tile([0, 1], sends.size)
        lost = rng.random(t_send.size) < params.loss
        rows.append((direction, t_send, t_arr, ids, seqs, lost))
    for direction, t_send, t_arr, ids, seqs, lost in rows:
        n = t_send.size

        def noise(n=n):
            e = rng.normal(0, params.ts_sigma_ns, n)
            tail = rng.random(n) < params.ts_tail_p
            e[tail] += rng.exponential(params.ts_tail_ns, int(tail.sum()))
            g = rng.random(n) < params.glitch_p
            e[g] += rng.choice([-1, 1], int(g.sum())) * rng.uniform(*params.glitch_ns, int(g.sum()))
            return e

        stamp_rx = t_arr.copy()
        if params.coalesce_p > 0:
            co = rng.random(n) < params.coalesce_p
            phase0 = rng.uniform(0, params.coalesce_ns)
            stamp_rx[co] = np.ceil((t_arr[co] - phase0) / params.coalesce_ns) * params.coalesce_ns + phase0
        if direction == "ab":  # tx on A (true time), rx on B
            tx_f = t_send + noise()
            rx_f = stamp_rx + theta(t_arr) + noise()
        else:  # tx on B, rx on A
            tx_f = t_send + theta(t_send) + noise()
            rx_f = stamp_rx + noise()
        for i in np.flatnonzero(~lost):
            probes.append((float(t_send[i]), {"dir": direction, "id": int(ids[i]), "seq": int(seqs[i]),
                                              "tx": epoch + int(round(tx_f[i])),
                                              "rx": epoch + int(round(rx_f[i]))}))
    probes.sort(key=lambda p: p[0])
    t_ref = float(round(params.t_ref_frac * window))
    # Mean drift over the window (what a straight line through θ should find).
    drift = (theta(window) - theta(0.0)) / window * 1e6
    doc = {"format": "lockstep.clocktrace/v1", "a": a, "b": b, "gap_ns": int(params.gap_ns),
           "t_ref_ns": epoch + int(round(t_ref)), "probes": [p for _, p in probes]}
    truth = {"offset_ns": float(theta(t_ref)),
             "drift_ppm": float(drift), "profile": profile if isinstance(profile, str) else "custom",
             "params": asdict(params), "seed": seed}
    return doc, truth
