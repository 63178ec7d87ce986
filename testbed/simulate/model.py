"""The statistical model of simulated probe windows: what every fault and every kind of noise
does to loss and one-way delay, in one place. Triangulation work may reason from this file.

Units: delays in microseconds (us), probabilities as fractions. One probe crosses, in order, the
source NIC's access link, zero or more switches and switch-switch links, and the destination's
access link. h = number of links on the path (2 on one leaf, 4 through a spine, 6 through a
core); a path of h links crosses h - 1 switches.

Calibration: the constants below reproduce the public examples (scenarios/*, 256-GPU fabric,
1,000 probes per pair): per-pair p50/p99 medians 1.45/2.18 us at h=2 and 2.95/3.89 us at h=4, and
the spread of those percentiles between pairs (sd of p50 ~0.008/0.012 us, of p99 ~0.05/0.06 us),
which is exactly the sampling spread of order statistics of 1,000 probes. Healthy loss is a few
per million per link, as in the examples (0-2 probes lost per healthy pair).

Healthy delay (every delivered probe)
  owd = BASE(h) + J(h)
  BASE(h) = LINK_US * h + SWITCH_US * (h - 1)                 propagation, serialization, FEC,
                                                               cut-through forwarding
  J(h)    = sum of 2 Exp(NIC_STAGE_US) + (h - 1) Exp(SWITCH_STAGE_US)
            independent exponential queueing/timestamping jitter at both NICs and every switch.
  A pair's p50/p99 are the sample percentiles of its delivered probes. They are drawn exactly
  without drawing every probe: the k-th order statistic of n uniforms is Beta(k, n + 1 - k) and is
  mapped through the quantile function of J(h), tabulated once per h by numerical convolution.

Healthy loss: every link direction has its own background loss rate drawn log-uniformly in
  `bg_loss` (default 1e-6..1e-5). No switch, NIC or host loss without a fault.

ECMP: unless a pair's path is known (the observation then carries `path`), its probes are spread
evenly over its ECMP paths. Its delivery probability is the mean over those paths of the product
of per-element survival probabilities (exact, `Incidence.mean_path_product`), and
lost ~ Binomial(sent, 1 - delivery). A delay component tied to an element applies to a probe with
probability x = the fraction of the pair's paths crossing that element (in the faulty direction).

Faults (`FAULT_KINDS`; parameters drawn uniformly from the ranges given):
  link_loss        one switch-switch link, one direction or both (50/50): every probe crossing
                   it in a faulty direction is dropped with probability `drop` in [0.01, 0.10].
                   No delay change (a marginal optic or bad cable drops, it does not queue).
  link_down        a switch-switch link dropping everything in both directions (`drop` = 1), as
                   before routing converges around it.
  link_congestion  (alias rate_limit) a link direction (or both) behind a rate limit with load:
                   a probe crossing it finds the queue busy with probability `busy` in [0.5, 0.9]
                   and then waits Exp(`queue_us` in [20, 200]); tail drops with `drop` in
                   [0.001, 0.01]. With an unknown path the delay hits a fraction x * busy of the
                   pair's probes: p99 rises, p50 moves only when x * busy > 1/2.
  switch_loss      a whole switch drops every probe that crosses it with `drop` in [0.02, 0.10].
  nic_loss         a NIC (or, equivalently, its access link: same paths, same culprit `nic`)
                   drops `drop` in [0.02, 0.15] of the probes it sends and receives.
  nic_down         the same with `drop` = 1.
  host_loss        all NICs of a host drop `drop` in [0.02, 0.15], both directions (a same-host
                   pair is hit twice).
  host_stall       the host's agent and responders are frozen for a fraction `stall` of the
                   window (1.0 with probability 1/2, else in [0.3, 0.9]): probes to its NICs are
                   lost with probability `stall`; its own NICs send round(sent * (1 - stall))
                   probes, and a host frozen the whole window reports no rows at all.
  host_delay       a host that delays its traffic persistently (CPU or PCIe starvation): every
                   probe to or from its NICs gets extra delay shift * Gamma(10, 0.1) (mean `shift_us`
                   in [10, 80], sd 0.32 * shift), once per end on the host; no loss. The median moves.

Noise that is not a fault:
  background loss (above), and noisy hosts: about NOISY_HOST_FRACTION of hosts (never a faulty
  one) have a noisy delay tail: each probe end on such a host gets, with probability `tail_p` in
  [0.02, 0.05], an extra Exp(`tail_mean_us` in [40, 110]) delay. p99 rises to roughly
  tail_mean * ln(tail_p / 0.01); p50 and loss stay normal.

Ground truth: each fault is one culprit, named by the smallest common element
(formats/fabric.md): a NIC or its access link -> `nic`; all NICs of a host -> `host`.
Its metadata, over the pairs the window reports: `pairs_touched` (pairs with x > 0; for a stall
also the stalled host's own pairs), `probe_traversals` (sum of sent * x, an end on a host counted
once per end; for a stall the probes sent to it), `expected_drops` (= traversals * drop, first
order), `equivalent` (other elements these probes cannot tell apart from it, e.g. a NIC's access
link), and for faults placed on an access link, `element` (that link).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# ---- healthy delay ----------------------------------------------------------------------------

LINK_US = 0.51
SWITCH_US = 0.092
NIC_STAGE_US = 0.115
SWITCH_STAGE_US = 0.15

# ---- noise ------------------------------------------------------------------------------------

BG_LOSS = (1e-6, 1e-5)
NOISY_HOST_FRACTION = 0.03
NOISY_TAIL_P = (0.02, 0.05)
NOISY_TAIL_MEAN_US = (40.0, 110.0)

_GRID_DX = 0.0005  # us
_GRID_MAX_SD = 14.0


def base_us(hops: np.ndarray | int) -> np.ndarray:
    h = np.asarray(hops, dtype=np.float64)
    return LINK_US * h + SWITCH_US * (h - 1)


@lru_cache(maxsize=32)
def _jitter_table(hops: int) -> tuple[np.ndarray, np.ndarray]:
    """(cdf, x) of J(hops) on a grid: deterministic numerical convolution of exponentials."""
    means = [NIC_STAGE_US] * 2 + [SWITCH_STAGE_US] * max(hops - 1, 0)
    total_mean = sum(means)
    sd = math.sqrt(sum(m * m for m in means))
    top = total_mean + _GRID_MAX_SD * sd + 2 * max(means) * 10
    x = np.arange(0.0, top, _GRID_DX)
    size = 1 << int(math.ceil(math.log2(2 * len(x))))
    spectrum = np.ones(size // 2 + 1, dtype=np.complex128)
    for m in means:
        # exact probability mass of Exp(m) in each grid cell, convolved via FFT
        cell = np.exp(-x / m) - np.exp(-(x + _GRID_DX) / m)
        spectrum *= np.fft.rfft(cell, size)
    dens = np.clip(np.fft.irfft(spectrum, size)[: len(x)], 0.0, None)
    cdf = np.cumsum(dens)
    cdf /= cdf[-1]
    # a sum of k cell indices i*dx lies in [i*dx, (i+k)*dx): centre it
    return cdf, x + len(means) * _GRID_DX / 2


def jitter_quantile(hops: int, u: np.ndarray) -> np.ndarray:
    """Quantile function of J(hops)."""
    cdf, x = _jitter_table(int(hops))
    return np.interp(u, cdf, x)


def order_stat_ranks(n: np.ndarray, q: float) -> np.ndarray:
    """1-based rank of the sample q-quantile among n values (numpy's default, rounded)."""
    return np.clip(np.rint(q * (np.asarray(n) - 1)).astype(np.int64) + 1, 1, np.maximum(n, 1))


def healthy_percentiles(
    hops: np.ndarray, n: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sample p50 and p99 of n healthy delays per pair, without drawing the n delays."""
    hops = np.asarray(hops, dtype=np.int64)
    n = np.asarray(n, dtype=np.int64)
    k50 = order_stat_ranks(n, 0.50)
    k99 = np.maximum(order_stat_ranks(n, 0.99), k50)
    u50 = rng.beta(k50, n + 1 - k50)
    gap = k99 - k50
    extra = np.where(gap > 0, rng.beta(np.maximum(gap, 1), n + 1 - k99), 0.0)
    u99 = u50 + (1.0 - u50) * extra
    p50 = np.empty(len(n))
    p99 = np.empty(len(n))
    for h in np.unique(hops):
        m = hops == h
        b = base_us(h)
        p50[m] = b + jitter_quantile(int(h), u50[m])
        p99[m] = b + jitter_quantile(int(h), u99[m])
    return p50, p99


_TABLE_BITS = 18


@lru_cache(maxsize=32)
def _quantile_table(hops: int) -> np.ndarray:
    """J(hops) quantiles at the centres of 2**18 equal probability bins."""
    m = 1 << _TABLE_BITS
    return jitter_quantile(hops, (np.arange(m) + 0.5) / m)


def healthy_delays(hops: int, size: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Draw individual healthy delays (for pairs whose distribution has extra components)."""
    table = _quantile_table(int(hops))
    return base_us(hops) + table[rng.integers(0, len(table), size=size)]


# ---- faults -----------------------------------------------------------------------------------


def _u(rng: np.random.Generator, lo: float, hi: float, digits: int = 5) -> float:
    return round(float(rng.uniform(lo, hi)), digits)


def _direction(rng: np.random.Generator) -> str:
    r = rng.random()
    return "both" if r < 0.5 else ("a-to-b" if r < 0.75 else "b-to-a")


@dataclass(frozen=True)
class FaultKind:
    name: str
    target: str  # which element it is placed on: link | switch | nic | host
    description: str
    draw: Callable[[np.random.Generator], dict]


def _link_loss(rng):
    return {"drop": _u(rng, 0.01, 0.10), "direction": _direction(rng)}


def _link_down(rng):
    return {"drop": 1.0, "direction": "both"}


def _link_congestion(rng):
    return {"drop": _u(rng, 0.001, 0.01), "busy": _u(rng, 0.5, 0.9, 3),
            "queue_us": _u(rng, 20.0, 200.0, 1), "direction": _direction(rng)}


def _switch_loss(rng):
    return {"drop": _u(rng, 0.02, 0.10)}


def _nic_loss(rng):
    return {"drop": _u(rng, 0.02, 0.15)}


def _nic_down(rng):
    return {"drop": 1.0}


def _host_loss(rng):
    return {"drop": _u(rng, 0.02, 0.15)}


def _host_stall(rng):
    stall = 1.0 if rng.random() < 0.5 else _u(rng, 0.3, 0.9, 3)
    return {"drop": stall, "stall": stall}


def _host_delay(rng):
    return {"drop": 0.0, "shift_us": _u(rng, 10.0, 80.0, 1)}


FAULT_KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind("link_loss", "link", "random loss on a switch-switch link, one direction or both", _link_loss),
        FaultKind("link_down", "link", "a switch-switch link dropping everything", _link_down),
        FaultKind("link_congestion", "link", "a rate-limited/congested link: queueing delay and some loss",
                  _link_congestion),
        FaultKind("switch_loss", "switch", "a whole switch dropping a fraction of what crosses it", _switch_loss),
        FaultKind("nic_loss", "nic", "a lossy NIC (or its access link)", _nic_loss),
        FaultKind("nic_down", "nic", "a dead NIC (or its access link)", _nic_down),
        FaultKind("host_loss", "host", "all NICs of a host lossy", _host_loss),
        FaultKind("host_stall", "host", "a host whose agent and responders are frozen", _host_stall),
        FaultKind("host_delay", "host", "a host delaying all its traffic (shifted median)", _host_delay),
    )
}

ALIASES = {
    "link": "link_loss",
    "loss": "link_loss",
    "down": "link_down",
    "congestion": "link_congestion",
    "rate_limit": "link_congestion",
    "switch": "switch_loss",
    "nic": "nic_loss",
    "host": "host_loss",
    "stall": "host_stall",
}


def draw_noisy_host(rng: np.random.Generator) -> dict:
    return {"tail_p": _u(rng, *NOISY_TAIL_P, 4), "tail_mean_us": _u(rng, *NOISY_TAIL_MEAN_US, 1)}


def host_delay_extra(shift_us: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return shift_us * rng.gamma(10.0, 0.1, size=np.shape(shift_us))
