"""A second scenario generator, independent of testbed.simulate, for the accuracy benchmark.

Everything testbed.simulate fixes is varied here, and the window is simulated probe by probe
(Monte Carlo) rather than from closed-form percentiles:

- **Topologies** (`SHAPES`): one switch; two-tier leaf-spine with hosts of 1-2 NICs on one leaf
  or spread over two; rail-optimized two-tier with 2-4 rails; k-ary fat trees (k = 4, 6);
  three-tier pods with cores; dual-homed NICs (one NIC cabled to two leaves). 1-3 parallel
  links between switches. Names unlike the public examples (`h07`, `h07-eth1`, `tor3`, `agg1`,
  `core0`, link ids `e123`), documents in shuffled order.
- **Probe pairs**: each NIC probes k random peers, or the full mesh, or its leaf plus k random
  peers; 0-20% of the rows then go missing.
- **Probes**: 100-3,000 per pair and window (varying per pair); a known `path` for none, all, a
  random share of the pairs, or the pairs of the NICs whose prober can trace; otherwise each
  probe takes an ECMP path uniformly at random.
- **Loss**: background per link direction log-uniform in 1e-6..1e-5, 1e-5..1e-4 or
  1e-4..1e-3; optional bursts (a few consecutive probes of one pair lost, tied to no element).
- **Delay**: per-cable propagation 0.2-1.5 us, per-switch latency 0.3-0.8 us, a NIC stack time
  at each end, gamma jitter per hop, per-host clock offsets (sync error) of sd 0-0.2 us; p50
  and p99 are sample percentiles (linear interpolation) of the delivered probes.
- **Noisy hosts** (not faults): 0-8% of hosts whose probes get, with probability 1.5-6% per end,
  an extra lognormal delay of median 30-150 us.
- **Faults** (`FAULT_KINDS`), 0-3 per window, on distinct non-nested elements that the window's
  probes can tell apart from every other element: link loss (1-30%, one direction or both),
  link down, link delay (a fixed 3-60 us on every crossing), link congestion (a queue met with
  probability 0.3-1, Exp(20-200 us)), switch loss, switch delay, NIC loss (tx, rx or both), NIC
  down, NIC delay, host loss, host stall (frozen part or all of the window), host delay.

The ground truth names the smallest common element (formats/fabric.md): a fault on the only
access link of a NIC is the NIC; a host fault is the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology

SHAPES = ("star", "clos2", "clos2-spread", "rail", "fattree", "clos3", "dualhomed")
FAULT_KINDS = ("link_loss", "link_down", "link_delay", "link_congestion", "switch_loss", "switch_delay",
               "nic_loss", "nic_down", "nic_delay", "host_loss", "host_stall", "host_delay")
MAX_PATHS = 64


# ---- topologies -----------------------------------------------------------------------------


class _Builder:
    def __init__(self, name: str):
        self.name = name
        self.hosts: list[str] = []
        self.switches: list[tuple[str, str]] = []
        self.nics: list[tuple[str, str, int | None]] = []
        self.links: list[tuple[str, str]] = []

    def host(self, nics: int) -> list[str]:
        h = f"h{len(self.hosts):02d}"
        self.hosts.append(h)
        out = []
        for k in range(nics):
            self.nics.append((f"{h}-eth{k}", h, k))
            out.append(f"{h}-eth{k}")
        return out

    def switch(self, prefix: str, tier: str) -> str:
        n = sum(1 for s, _ in self.switches if s.startswith(prefix))
        name = f"{prefix}{n}"
        self.switches.append((name, tier))
        return name

    def cable(self, a: str, b: str, parallel: int = 1) -> None:
        for _ in range(parallel):
            self.links.append((a, b))

    def document(self, rng: np.random.Generator, rails: bool) -> dict[str, Any]:
        order = rng.permutation(len(self.links))
        links = [{"id": f"e{i}", "a": self.links[j][0], "b": self.links[j][1]} for i, j in enumerate(order)]
        # some cables written switch first: the ends' order must not matter
        for link in links:
            if rng.random() < 0.5:
                link["a"], link["b"] = link["b"], link["a"]
        return {
            "format": "lockstep.topology/v1",
            "name": self.name,
            "hosts": [{"name": h} for h in rng.permutation(self.hosts).tolist()],
            "switches": [{"name": s, "tier": t} for s, t in (self.switches[i] for i in rng.permutation(len(self.switches)))],
            "nics": [{"name": n, "host": h} | ({"rail": r} if rails and r is not None else {})
                     for n, h, r in (self.nics[i] for i in rng.permutation(len(self.nics)))],
            "links": links,
        }


def make_topology(shape: str, size: str, rng: np.random.Generator) -> dict[str, Any]:
    """A topology document of the given shape; size 'small' (<= ~64 NICs) or 'medium' (<= ~300)."""
    med = size == "medium"
    b = _Builder(f"{shape}-{size}-{int(rng.integers(1 << 30))}")
    rails = False
    if shape == "star":
        sw = b.switch("sw", "leaf")
        for _ in range(int(rng.integers(12, 40 if med else 20))):
            for n in b.host(int(rng.integers(1, 3))):
                b.cable(n, sw)
    elif shape in ("clos2", "clos2-spread", "dualhomed"):
        leaves = [b.switch("tor", "leaf") for _ in range(int(rng.integers(6, 16) if med else rng.integers(3, 6)))]
        spines = [b.switch("agg", "spine") for _ in range(int(rng.integers(2, 6)))]
        par = int(rng.integers(1, 4))
        for lf in leaves:
            for sp in spines:
                b.cable(lf, sp, par)
        per_leaf = int(rng.integers(6, 14) if med else rng.integers(3, 7))
        for i, lf in enumerate(leaves):
            for _ in range(per_leaf):
                nics = b.host(2 if shape != "clos2" or rng.random() < 0.5 else 1)
                for k, n in enumerate(nics):
                    if shape == "clos2":
                        b.cable(n, lf)
                    elif shape == "clos2-spread":
                        b.cable(n, leaves[(i + k) % len(leaves)])
                    else:  # dual-homed NICs: every NIC on two leaves
                        b.cable(n, lf)
                        b.cable(n, leaves[(i + 1) % len(leaves)])
    elif shape == "rail":
        rails = True
        n_rails = int(rng.integers(2, 5))
        sus = int(rng.integers(3, 6) if med else 2)
        per_su = int(rng.integers(6, 16) if med else rng.integers(3, 6))
        spines = [b.switch("spine", "spine") for _ in range(int(rng.integers(2, 7)))]
        par = int(rng.integers(1, 3))
        for _su in range(sus):
            leaves = [b.switch("rail", "leaf") for _ in range(n_rails)]
            for lf in leaves:
                for sp in spines:
                    b.cable(lf, sp, par)
            for _ in range(per_su):
                for k, n in enumerate(b.host(n_rails)):
                    b.cable(n, leaves[k])
    elif shape == "fattree":
        k = 6 if med else 4
        cores = [[b.switch("core", "core") for _ in range(k // 2)] for _ in range(k // 2)]
        for _pod in range(k):
            edges = [b.switch("edge", "leaf") for _ in range(k // 2)]
            aggs = [b.switch("agg", "spine") for _ in range(k // 2)]
            for e in edges:
                for a in aggs:
                    b.cable(e, a)
                for _ in range(k // 2):
                    for n in b.host(1):
                        b.cable(n, e)
            for j, a in enumerate(aggs):
                for c in cores[j]:
                    b.cable(a, c)
    elif shape == "clos3":
        pods = int(rng.integers(3, 5) if med else 2)
        planes = int(rng.integers(2, 4))
        cores_per_plane = int(rng.integers(1, 3))
        par = int(rng.integers(1, 3))
        cores = [[b.switch("core", "core") for _ in range(cores_per_plane)] for _ in range(planes)]
        for _p in range(pods):
            aggs = [b.switch("agg", "spine") for _ in range(planes)]
            for j, a in enumerate(aggs):
                for c in cores[j]:
                    b.cable(a, c, par)
            for _lf in range(int(rng.integers(2, 5) if med else 2)):
                lf = b.switch("tor", "leaf")
                for a in aggs:
                    b.cable(lf, a)
                for _ in range(int(rng.integers(3, 8) if med else rng.integers(2, 5))):
                    for n in b.host(int(rng.integers(1, 3))):
                        b.cable(n, lf)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return b.document(rng, rails)


# ---- the window -----------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    target: str  # link | switch | nic | host
    index: int  # link, switch, NIC or host index (PathIndex order)
    params: dict[str, float]
    culprit: tuple[str, str] = ("", "")


@dataclass
class Scenario:
    topology: dict[str, Any]
    observations: dict[str, Any]
    truth: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)


def _loguniform(rng, lo, hi):
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


class _Elements:
    """Per pair path tables: for each ECMP path, its directed links and switches."""

    def __init__(self, index: PathIndex, src: np.ndarray, dst: np.ndarray, known: list):
        self.index = index
        self.paths: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
        names = index.nic_names
        for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            plist = [known[i]] if known[i] is not None else index.paths(names[s], names[d])
            entries = []
            for p in plist:
                nodes = index.walk(names[s], p)
                lk = np.array([index.link_index[x] for x in p], dtype=np.int64)
                fwd = np.array([index.link_a[k] == nodes[j] for j, k in enumerate(lk)], dtype=bool)
                sw = np.array([index.switch_index[n] for n in nodes[1:-1]], dtype=np.int64)
                entries.append((lk, fwd, sw))
            self.paths.append(entries)


def _signatures(index: PathIndex, src, dst, paths, sent, rng) -> dict[tuple[str, int, str], tuple]:
    """Incidence signature of every element (link directions, switches, NICs, hosts): equal
    signatures mean the window's probes cannot tell the elements apart."""
    inc = index.incidence([(index.nic_names[s], index.nic_names[d]) for s, d in zip(src, dst, strict=True)], paths)
    w = np.stack((rng.random(len(src)) + 0.5, rng.random(len(src)) + 0.5), axis=1)
    fwd, rev, sw = inc.loads(w)
    N, H = len(index.nic_names), len(index.host_names)
    nic = np.stack([np.bincount(src, w[:, c], N) + np.bincount(dst, w[:, c], N) for c in range(2)], axis=1)
    hs, hd = index.nic_host[src], index.nic_host[dst]
    host = np.stack([np.bincount(hs, w[:, c], H) + np.bincount(hd, w[:, c], H) for c in range(2)], axis=1)
    load = inc.loads(np.asarray(sent, dtype=np.float64))
    sig: dict = {"_inc": inc}
    for k in range(len(index.link_ids)):
        sig[("link", k, "ab")] = (tuple(np.round(fwd[k], 9)), float(load[0][k]))
        sig[("link", k, "ba")] = (tuple(np.round(rev[k], 9)), float(load[1][k]))
        sig[("link", k, "both")] = (tuple(np.round(fwd[k] + rev[k], 9)), float(load[0][k] + load[1][k]))
    for s in range(len(index.switch_names)):
        sig[("switch", s, "")] = (tuple(np.round(sw[s], 9)), float(load[2][s]))
    for n in range(N):
        sig[("nic", n, "")] = (tuple(np.round(nic[n], 9)), 0.0)
    for h in range(H):
        sig[("host", h, "")] = (tuple(np.round(host[h], 9)), 0.0)
    return sig


def simulate(doc: dict[str, Any], rng: np.random.Generator, n_faults: int | None = None,
             kinds: tuple[str, ...] = FAULT_KINDS) -> Scenario:
    topo = parse_topology(doc)
    index = PathIndex(topo)
    N, H = len(index.nic_names), len(index.host_names)
    nic_host = index.nic_host
    leaf_of = index.nic_switch

    # 1. pairs
    strategy = rng.choice(["random", "mesh", "local"], p=[0.5, 0.2, 0.3]) if N <= 48 else \
        rng.choice(["random", "local"], p=[0.6, 0.4])
    k = int(rng.integers(3, 21))
    pairs = set()
    for s in range(N):
        peers = [d for d in range(N) if d != s]
        if strategy == "mesh":
            chosen = peers
        else:
            chosen = list(rng.choice(peers, size=min(k, len(peers)), replace=False))
            if strategy == "local":
                chosen += [d for d in peers if leaf_of[d] >= 0 and leaf_of[d] == leaf_of[s]]
        pairs.update((s, int(d)) for d in chosen)
    pairs = sorted(pairs)
    missing = float(rng.choice([0.0, 0.05, 0.2], p=[0.5, 0.3, 0.2]))
    pairs = [p for p in pairs if rng.random() >= missing]
    src = np.array([p[0] for p in pairs], dtype=np.int64)
    dst = np.array([p[1] for p in pairs], dtype=np.int64)
    n_pairs = len(pairs)

    # 2. probes per pair and known paths
    base_sent = int(rng.choice([100, 200, 500, 1000, 3000], p=[0.15, 0.2, 0.25, 0.3, 0.1]))
    sent = np.maximum(1, np.round(base_sent * rng.uniform(0.85, 1.0, n_pairs))).astype(np.int64)
    path_mode = str(rng.choice(["none", "all", "share", "tracers"], p=[0.35, 0.15, 0.3, 0.2]))
    if path_mode == "none":
        has_path = np.zeros(n_pairs, dtype=bool)
    elif path_mode == "all":
        has_path = np.ones(n_pairs, dtype=bool)
    elif path_mode == "share":
        has_path = rng.random(n_pairs) < rng.uniform(0.2, 0.8)
    else:
        tracer = rng.random(N) < rng.uniform(0.3, 0.8)
        has_path = tracer[src]
    known: list = [None] * n_pairs
    names = index.nic_names
    for i in np.flatnonzero(has_path):
        plist = index.paths(names[src[i]], names[dst[i]])
        known[i] = plist[int(rng.integers(len(plist)))]
    el = _Elements(index, src, dst, known)

    # 3. faults
    if n_faults is None:
        n_faults = int(rng.choice([0, 1, 2, 3], p=[0.15, 0.45, 0.25, 0.15]))
    sig = _signatures(index, src, dst, known, sent, rng)
    faults = _place(index, sig, rng, n_faults, kinds, el, sent)

    # 4. element state
    L, S = len(index.link_ids), len(index.switch_names)
    bg_lo, bg_hi = [(1e-6, 1e-5), (1e-5, 1e-4), (1e-4, 1e-3)][int(rng.choice(3, p=[0.4, 0.4, 0.2]))]
    drop = np.exp(rng.uniform(math.log(bg_lo), math.log(bg_hi), size=(L, 2)))  # [link, 0: a->b, 1: b->a]
    sw_drop = np.zeros(S)
    nic_drop = np.zeros((N, 2))  # tx, rx
    host_drop = np.zeros((H, 2))
    link_shift = np.zeros((L, 2))
    sw_shift = np.zeros(S)
    nic_shift = np.zeros((N, 2))
    host_shift = np.zeros(H)
    congestion: dict[tuple[int, int], tuple[float, float]] = {}
    stall = np.zeros(H)
    for f in faults:
        p = f.params
        if f.target == "link":
            dirs = {"ab": [0], "ba": [1], "both": [0, 1]}[p.get("dir", "both")]
            for d in dirs:
                if f.kind in ("link_loss", "link_down"):
                    drop[f.index, d] = 1 - (1 - drop[f.index, d]) * (1 - p["rate"])
                elif f.kind == "link_delay":
                    link_shift[f.index, d] += p["shift"]
                else:
                    congestion[(f.index, d)] = (p["busy"], p["queue"])
        elif f.target == "switch":
            if f.kind == "switch_loss":
                sw_drop[f.index] = p["rate"]
            else:
                sw_shift[f.index] = p["shift"]
        elif f.target == "nic":
            dirs = {"tx": [0], "rx": [1], "both": [0, 1]}[p.get("dir", "both")]
            for d in dirs:
                if f.kind in ("nic_loss", "nic_down"):
                    nic_drop[f.index, d] = p["rate"]
                else:
                    nic_shift[f.index, d] = p["shift"]
        else:
            if f.kind == "host_loss":
                host_drop[f.index] = p["rate"]
            elif f.kind == "host_stall":
                stall[f.index] = p["stall"]
            else:
                host_shift[f.index] = p["shift"]
    cable = rng.uniform(0.2, 1.5, L)
    sw_lat = rng.uniform(0.3, 0.8, S)
    nic_stack = float(rng.uniform(0.3, 1.0))
    jitter = float(rng.uniform(0.04, 0.15))
    clock = rng.normal(0.0, float(rng.choice([0.0, 0.05, 0.2])), H)
    noisy_share = float(rng.choice([0.0, 0.03, 0.08], p=[0.3, 0.4, 0.3]))
    faulty_hosts = {f.index for f in faults if f.target == "host"} | {int(nic_host[f.index]) for f in faults
                                                                      if f.target == "nic"}
    noisy = {h: (float(rng.uniform(0.015, 0.06)), float(rng.uniform(30, 150)))
             for h in range(H) if h not in faulty_hosts and rng.random() < noisy_share}
    burst_p = float(rng.choice([0.0, 0.01, 0.03], p=[0.5, 0.3, 0.2]))

    # 5. probes, pair by pair
    probes = []
    for i in range(n_pairs):
        s, d = int(src[i]), int(dst[i])
        hs, hd = int(nic_host[s]), int(nic_host[d])
        n = int(sent[i])
        if stall[hs] > 0:  # the frozen host sends only while it runs
            n = int(round(n * (1 - stall[hs])))
            if n == 0:
                continue
        tab = el.paths[i]
        m = len(tab)
        surv = np.empty(m)
        base = np.empty(m)
        shift = np.empty(m)
        hops = np.empty(m)
        cong: list[list[tuple[float, float]]] = []
        end = (1 - nic_drop[s, 0]) * (1 - nic_drop[d, 1]) * (1 - host_drop[hs, 0]) * (1 - host_drop[hd, 1]) \
            * (1 - stall[hd])
        for j, (lk, fwd, sw) in enumerate(tab):
            dcol = np.where(fwd, 0, 1)
            surv[j] = end * np.prod(1 - drop[lk, dcol]) * np.prod(1 - sw_drop[sw])
            base[j] = cable[lk].sum() + sw_lat[sw].sum() + 2 * nic_stack
            shift[j] = (link_shift[lk, dcol].sum() + sw_shift[sw].sum() + nic_shift[s, 0] + nic_shift[d, 1]
                        + host_shift[hs] + host_shift[hd])
            hops[j] = len(lk)
            cong.append([congestion[(int(a), int(b))] for a, b in zip(lk, dcol, strict=True)
                         if (int(a), int(b)) in congestion])
        choice = rng.integers(m, size=n)
        alive = rng.random(n) < surv[choice]
        lost = int(n - alive.sum())
        if burst_p and rng.random() < burst_p:
            lost = min(n, lost + 1 + int(rng.poisson(2)))
        delivered = choice[alive][: n - lost]
        row: dict[str, Any] = {"src": names[s], "dst": names[d], "sent": n, "lost": lost}
        if delivered.size:
            c = delivered
            owd = base[c] + rng.gamma(1.5 * hops[c], jitter) + shift[c] + (clock[hd] - clock[hs])
            for j in np.unique(c):
                for busy, queue in cong[j]:
                    on = np.flatnonzero(c == j)
                    hit = on[rng.random(len(on)) < busy]
                    owd[hit] += rng.exponential(queue, len(hit))
            for h in (hs, hd):
                if h in noisy:
                    tp, tm = noisy[h]
                    hit = rng.random(len(owd)) < tp
                    owd[hit] += rng.lognormal(math.log(tm), 0.5, int(hit.sum()))
            for f in faults:  # host delay: a shifted median, with a spread of its own
                if f.kind == "host_delay" and f.index in (hs, hd):
                    owd += rng.normal(0.0, 0.2 * f.params["shift"], len(owd))
            p50, p99 = np.percentile(owd, [50, 99])
            row["owd_us"] = {"p50": round(float(max(p50, 0.0)), 2), "p99": round(float(max(p99, p50, 0.0)), 2)}
        if known[i] is not None:
            row["path"] = list(known[i])
        probes.append(row)
    observations = {"format": "lockstep.observations/v1", "topology": topo.name,
                    "window_s": float(rng.choice([0.1, 1.0, 10.0])), "probes": probes}
    culprits = [{"kind": f.culprit[0], "name": f.culprit[1], "confidence": 1.0, "fault": f.kind,
                 **{k: v for k, v in f.params.items()}} for f in faults]
    truth = {"format": "lockstep.verdict/v1",
             "network_ok": not any(c["kind"] in ("link", "switch", "nic") for c in culprits),
             "culprits": culprits}
    info = {"strategy": str(strategy), "pairs": len(probes), "sent": base_sent, "path_mode": path_mode,
            "missing": missing, "bg": [bg_lo, bg_hi], "noisy_hosts": len(noisy), "burst_p": burst_p}
    return Scenario(doc, observations, truth, info)


def _place(index: PathIndex, sig, rng, n_faults, kinds, el: _Elements, sent) -> list[Fault]:
    """Faults on distinct, non-nested, identifiable, sufficiently probed elements."""
    groups: dict[tuple, list] = {}
    inc = sig["_inc"]
    for key, val in sig.items():
        if key != "_inc":
            groups.setdefault(val[0], []).append(key)
    N = len(index.nic_names)
    nics_per_host = np.bincount(index.nic_host, minlength=len(index.host_names))
    single_access = {int(k): n for n, k in enumerate(index.nic_access.tolist()) if k >= 0}
    used_links: set[int] = set()
    used_sw: set[int] = set()
    used_nics: set[int] = set()
    used_hosts: set[int] = set()
    faults: list[Fault] = []

    def alone(key) -> bool:
        vec, load = sig[key]
        if not any(vec):
            return False
        same = [k for k in groups[vec] if k != key and not (k[0] == key[0] == "link" and k[1] == key[1])]
        if key[0] == "link" and key[1] in single_access:  # an access link is its NIC
            same = [k for k in same if k != ("nic", single_access[key[1]], "")]
        if key[0] == "nic":
            acc = int(index.nic_access[key[1]])
            same = [k for k in same if not (k[0] == "link" and k[1] == acc)]
        if key[0] == "host":  # a host of one NIC is named as the host (formats/fabric.md)
            own = {n for n in range(N) if int(index.nic_host[n]) == key[1]}
            acc = {int(index.nic_access[n]) for n in own}
            same = [k for k in same if not ((k[0] == "nic" and k[1] in own) or (k[0] == "link" and k[1] in acc))]
        return not same

    for _ in range(n_faults):
        for _attempt in range(200):
            kind = str(rng.choice(kinds))
            target = kind.split("_")[0]
            params: dict[str, Any] = {}
            if kind in ("link_loss", "switch_loss", "nic_loss", "host_loss"):
                params["rate"] = round(_loguniform(rng, 0.01, 0.3), 4)
            if kind in ("link_down", "nic_down"):
                params["rate"] = 1.0
            if kind in ("link_delay", "switch_delay", "nic_delay", "host_delay"):
                params["shift"] = round(float(rng.uniform(3.0, 60.0)), 2)
            if kind == "link_congestion":
                params["busy"] = round(float(rng.uniform(0.3, 1.0)), 3)
                params["queue"] = round(float(rng.uniform(20.0, 200.0)), 1)
            if kind == "host_stall":
                params["stall"] = 1.0 if rng.random() < 0.4 else round(float(rng.uniform(0.3, 0.9)), 3)
            if target == "link":
                k = int(rng.integers(len(index.link_ids)))
                sa, sb = int(index.link_switch_a[k]), int(index.link_switch_b[k])
                if k in used_links or sa in used_sw or sb in used_sw:
                    continue
                if k in single_access:  # access cables are NIC faults here
                    continue
                d = str(rng.choice(["ab", "ba", "both"])) if kind in ("link_loss", "link_congestion", "link_delay") \
                    else "both"
                params["dir"] = d
                key = ("link", k, d)
                culprit = ("link", index.link_ids[k])
            elif target == "switch":
                k = int(rng.integers(len(index.switch_names)))
                touching = {int(index.link_switch_a[x]) for x in used_links} | {int(index.link_switch_b[x])
                                                                              for x in used_links}
                if k in used_sw or k in touching:
                    continue
                key = ("switch", k, "")
                culprit = ("switch", index.switch_names[k])
            elif target == "nic":
                k = int(rng.integers(N))
                h = int(index.nic_host[k])
                same_host = sum(1 for x in used_nics if int(index.nic_host[x]) == h)
                if k in used_nics or h in used_hosts or same_host + 1 >= nics_per_host[h]:
                    continue
                if kind != "nic_down":
                    params["dir"] = str(rng.choice(["tx", "rx", "both"]))
                key = ("nic", k, "")
                culprit = ("nic", index.nic_names[k])
            else:
                k = int(rng.integers(len(index.host_names)))
                if k in used_hosts or any(int(index.nic_host[x]) == k for x in used_nics):
                    continue
                key = ("host", k, "")
                culprit = ("host", index.host_names[k])
            if not alone(key) or not _detectable(index, inc, sent, target, k, kind, params):
                continue
            f = Fault(kind, target, k, params, culprit)
            faults.append(f)
            {"link": used_links, "switch": used_sw, "nic": used_nics, "host": used_hosts}[target].add(k)
            break
    return faults


def _detectable(index: PathIndex, inc, sent, target: str, k: int, kind: str, params) -> bool:
    """Enough probes cross the element for its fault to show: >= 10 expected losses over >= 2
    pairs for a loss fault; >= 3 pairs mostly (x >= 0.5) or partly (x >= 0.05) through it for a
    delay fault."""
    if target == "link":
        fw, rv = inc.link_fractions([index.link_ids[k]], directed=True)
        d = params.get("dir", "both")
        frac = (fw[:, 0] if d != "ba" else 0) + (rv[:, 0] if d != "ab" else 0)
    elif target == "switch":
        frac = inc.switch_fractions([index.switch_names[k]])[:, 0]
    elif target == "nic":
        d = params.get("dir", "both")
        frac = ((inc.src == k) & (d != "rx")) | ((inc.dst == k) & (d != "tx"))
    else:
        hs, hd = index.nic_host[inc.src], index.nic_host[inc.dst]
        frac = (hs == k) | (hd == k) if kind != "host_stall" else (hd == k)
    frac = np.asarray(frac, dtype=np.float64)
    sent = np.asarray(sent, dtype=np.float64)
    if "rate" in params or "stall" in params:
        rate = params.get("rate", params.get("stall"))
        return float((frac * sent).sum() * rate) >= 10 and int((frac > 0).sum()) >= 2
    need = 0.5 if kind in ("link_delay", "switch_delay", "nic_delay", "host_delay") else 0.05
    # a delay shows against the healthy delay of the other pairs: most must be untouched
    return int((frac >= need).sum()) >= 3 and float((frac > 0).mean()) <= 0.6


def scenario(seed: int, size: str | None = None, shape: str | None = None, n_faults: int | None = None,
             kinds: tuple[str, ...] = FAULT_KINDS) -> Scenario:
    """One random scenario (topology, observations, truth) for a seed."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 20261201]))
    size = size or str(rng.choice(["small", "medium"], p=[0.5, 0.5]))
    shape = shape or str(rng.choice(SHAPES))
    for _ in range(20):
        doc = make_topology(shape, size, rng)
        index = PathIndex(parse_topology(doc))
        nn = index.nic_names
        far = max((index.count_paths(nn[0], nn[j]) for j in range(1, len(nn), max(1, len(nn) // 16))), default=1)
        if far <= MAX_PATHS and index.connected():
            break
    sc = simulate(doc, rng, n_faults, kinds)
    sc.info.update({"seed": seed, "shape": shape, "size": size, "nics": len(doc["nics"])})
    return sc
