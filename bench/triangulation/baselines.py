"""Two baselines for the accuracy benchmark, as their papers describe them.

Both see the same window as the triangulation and the same notion of a *bad* pair:

- **bad pair**: it drops or delays its traffic persistently: its loss is significant against
  the window's background (binomial tail probability below 1e-4 at the median per-hop loss
  rate of the window, and at least 2 probes lost), or its median one-way delay is anomalous for
  its hop count (more than 6 robust standard deviations and 30% above the window's median for
  that hop count). Tails (p99) are left out: both methods look for elements that drop or slow
  everything, and noisy end hosts would otherwise flood them.

**007** (Arzani et al., NSDI 2018, "007: Democratically Finding the Cause of Packet Drops"):
every flow with a problem votes; a flow of h links gives 1/h of a vote to each link of its path
(the path comes from a traceroute in 007; here from the observation's `path`: the bad pairs with
a known path vote; only when none has one, every bad pair votes over its ECMP paths in
proportion to the share of paths through each link, the vote 007 would cast on average). Votes are tallied per window and links ranked; a link is
blamed when its tally is a clear outlier: above the mean plus 3 standard deviations of the
non-zero tallies, at least half the top tally (the paper blames the top-voted links) and at
least one full vote (more than one voter). 007
names links only: a NIC's access link is reported as that NIC (formats/fabric.md), and the
element grouping of the verdict (every NIC of a host -> the host, every port of a switch -> the
switch) is applied, as for the triangulation.

**Greedy set cover** (binary tomography as in Kompella et al., "Detection and localization of
network black holes", INFOCOM 2007, and NetDiagnoser/Tomo): elements on every path of a good
pair are good (with ECMP: those the pair crosses on all its paths: its NICs, hosts, leaf
switches, and every element of a known path); among the other elements, repeatedly pick the one
that covers the most not-yet-explained bad pairs (ties: the highest hit ratio, bad / all pairs
through it, as in deTector), until every bad pair is explained or no element explains two.
Candidates: links, switches, NICs and hosts.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

from workers.fabric.observations import Window
from workers.triangulation.fabric import KIND_LINK, KIND_NIC, FabricModel, Prepared
from workers.triangulation.localize import Culprit, Verdict, _Found, _verdict

BAD_LOSS_P = 1e-4
DELAY_Z = 6.0
DELAY_REL = 0.3


def bad_pairs(prep: Prepared) -> np.ndarray:
    """Boolean per pair of the window: lossy beyond background, or delay-anomalous."""
    n, k, h = prep.sent, prep.lost, prep.hops_bg
    per_hop = np.median(k / np.maximum(n * h, 1))
    rate = np.clip(per_hop * h, 1e-7, 0.5)
    p = binom.sf(k - 1, n.astype(np.int64), rate)
    bad = (k >= 2) & (p < BAD_LOSS_P)
    usable = np.isfinite(prep.p50) & np.isfinite(prep.p99) & (n - k >= 5)
    for values in (prep.p50,):
        for hop in np.unique(h[usable]):
            g = usable & (h == hop)
            v = values[g]
            med = np.median(v)
            mad = max(1.4826 * np.median(np.abs(v - med)), 1e-3 * abs(med), 1e-3)
            idx = np.flatnonzero(g)
            bad[idx] |= (v - med > DELAY_Z * mad) & (v - med > DELAY_REL * med)
    return bad


def _all_columns(prep: Prepared, elements: np.ndarray):
    cols = prep.columns(elements)
    return prep.restrict(cols, np.arange(prep.n)).tocsc()


def vote_007(model: FabricModel, window: Window) -> Verdict:
    prep = model.prepare(window)
    bad = bad_pairs(prep)
    m = model
    links = np.flatnonzero((m.kind == KIND_LINK) & m.candidate)
    access = m.access_of_nic  # a NIC's single access link, voted as the NIC (both directions)
    # 007 votes with the traced path of each bad flow: the pairs with a known path; only when no
    # bad pair has one, every bad pair votes over its ECMP paths
    voters = bad & prep.known if (bad & prep.known).any() else bad
    w = np.where(voters, 1.0 / np.maximum(prep.hops_bg, 1.0), 0.0)
    adj = prep.adjoint(w[:, None])[:, 0]
    votes: dict[tuple[int, int], float] = {}
    for e in links:
        k = e // 2
        votes[(KIND_LINK, k)] = votes.get((KIND_LINK, k), 0.0) + adj[e]
    nic_votes = np.bincount(prep.src, w, m.n_nics) + np.bincount(prep.dst, w, m.n_nics)
    for nic in np.flatnonzero(access >= 0):
        votes[(KIND_NIC, int(nic))] = float(nic_votes[nic])
    tally = np.array(list(votes.values()))
    keys = list(votes)
    found: list[_Found] = []
    nz = tally[tally > 0]
    if nz.size:
        top = float(nz.max())
        thr = max(float(nz.mean() + 3 * nz.std()), 0.5 * top, 1.0)
        for key, v in zip(keys, tally, strict=True):
            if v > 0 and v >= thr:
                e = (2 * key[1]) if key[0] == KIND_LINK else m.nic_tx0 + key[1]
                found.append(_Found(int(e), float(v / top), float(v), 0, "votes"))
    return _plain(_verdict(m, found, {}))


def greedy_set_cover(model: FabricModel, window: Window) -> Verdict:
    prep = model.prepare(window)
    bad = bad_pairs(prep)
    m = model
    if not bad.any():
        return Verdict(True, ())
    # candidate elements: undirected (link directions merged), switches, NIC and host (both ways)
    link_e = np.flatnonzero((m.kind == KIND_LINK) & m.candidate)
    sw_e = np.arange(2 * m.n_links, m.n_fabric)
    nic_tx = np.arange(m.nic_tx0, m.nic_rx0)
    host_tx = np.arange(m.host_tx0, m.host_rx0)
    # which elements touch bad pairs at all (cheap screen over every element)
    touch = prep.adjoint(bad.astype(np.float64)[:, None])[:, 0] > 0
    groups: list[np.ndarray] = []
    names: list[int] = []
    for e in link_e[touch[link_e]]:
        if e % 2 == 0 or not touch[e - 1]:
            pair = np.array([e - e % 2, e - e % 2 + 1])
            groups.append(pair[m.candidate[pair]])
            names.append(int(e - e % 2))
    for e in sw_e[touch[sw_e]]:
        groups.append(np.array([e]))
        names.append(int(e))
    for base, rx0 in ((nic_tx, m.nic_rx0 - m.nic_tx0), (host_tx, m.host_rx0 - m.host_tx0)):
        for e in base:
            if touch[e] or touch[e + rx0]:
                groups.append(np.array([e, e + rx0]))
                names.append(int(e))
    if not groups:
        return Verdict(True, ())
    flat = np.concatenate(groups)
    owner = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    X = _all_columns(prep, flat)
    # per candidate: pairs through it (any share), and pairs crossing it on every path
    Xc = X.tocsc()
    through = [set() for _ in groups]
    always = [set() for _ in groups]
    for j in range(len(flat)):
        rows = Xc.indices[Xc.indptr[j]:Xc.indptr[j + 1]]
        vals = Xc.data[Xc.indptr[j]:Xc.indptr[j + 1]]
        through[owner[j]].update(rows.tolist())
        always[owner[j]].update(rows[vals >= 1 - 1e-9].tolist())
    good = set(np.flatnonzero(~bad).tolist())
    badset = set(np.flatnonzero(bad).tolist())
    alive = [i for i in range(len(groups)) if not (always[i] & good)]
    unexplained = set(badset)
    chosen: list[int] = []
    while unexplained and alive:
        best, best_key = None, (1, -1.0)
        for i in alive:
            cover = len(through[i] & unexplained)
            hit = len(through[i] & badset) / max(len(through[i]), 1)
            if (cover, hit) > best_key:
                best, best_key = i, (cover, hit)
        if best is None or best_key[0] < 2:
            break
        chosen.append(best)
        unexplained -= through[best]
        alive.remove(best)
    found = [_Found(names[i], 1.0, 0.0, len(through[i]), "cover") for i in chosen]
    return _plain(_verdict(m, found, {}))


def _plain(v: Verdict) -> Verdict:
    return Verdict(v.network_ok, tuple(Culprit(c.kind, c.name, c.confidence) for c in v.culprits))
