"""Simulated probe windows (`lockstep.observations/v1`) with injected faults and ground truth.

`simulate(topology_doc, WindowConfig(...)) -> Scenario` builds one window the way the public
examples (scenarios/*) are built; every number it draws follows `testbed.simulate.model`.

1. Probe pairs. Every NIC probes `peers_per_nic` distinct peers, split by `peer_mix` into
   (same leaf, same rail on another leaf of the same pod, everything else: other rails or other
   pods); a category with too few candidates hands its share to the next. Pods are the connected
   groups of non-core switches (one pod in a two-tier fabric).
2. Known paths: each pair independently, with probability `path_fraction`, carries `path`, one
   of its ECMP paths drawn uniformly; the others spread their probes over all ECMP paths.
3. Faults from a spec such as `link_loss:1,switch_loss:1` (kinds and aliases in
   `model.FAULT_KINDS` / `model.ALIASES`), placed on distinct, non-nested elements (no link of a
   faulty switch, no NIC of a faulty host, never every NIC of one host). With
   `identifiable_only`, only on elements that the window's probes can tell apart from every
   other element (a distinct incidence signature) and that carry at least one pair's worth of
   probes; a NIC and its access link are always indistinguishable and are named as the NIC.
4. Noisy hosts (not faults), background loss, loss and delays per pair (`model`).
5. Ground truth: a `lockstep.verdict/v1` document whose culprits are the faults, named by the
   smallest common element, with per-culprit metadata and the `scenario` block of the examples.

Each random ingredient has its own stream spawned from `seed`, so the same seed and inputs give
byte-identical output, and changing the faults does not reshuffle the probe pairs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from testbed.simulate import model
from testbed.simulate.topology import TopoParams, dump_topology, params_from_name
from workers.fabric.paths import Incidence, PathIndex
from workers.fabric.topology import Topology, parse_topology

OBS_FORMAT = "lockstep.observations/v1"
VERDICT_FORMAT = "lockstep.verdict/v1"
GENERATOR = "testbed.simulate/1"


class SimulationError(ValueError):
    """The requested window cannot be generated (bad spec, no place for a fault, ...)."""


@dataclass(frozen=True)
class WindowConfig:
    faults: str = "none"
    seed: int = 0
    peers_per_nic: int = 16
    peer_mix: tuple[float, float, float] = (0.25, 0.5, 0.25)
    sent: int = 1000
    path_fraction: float = 0.3
    window_s: float = 10.0
    noisy_hosts: int | None = None  # None: Binomial(hosts, model.NOISY_HOST_FRACTION)
    bg_loss: tuple[float, float] = model.BG_LOSS
    identifiable_only: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.peers_per_nic < 1:
            problems.append(f"peers_per_nic must be >= 1, got {self.peers_per_nic}")
        if len(self.peer_mix) != 3 or any(m < 0 for m in self.peer_mix) or sum(self.peer_mix) <= 0:
            problems.append(f"peer_mix must be three non-negative shares, got {self.peer_mix}")
        if self.sent < 1:
            problems.append(f"sent must be >= 1, got {self.sent}")
        if not 0.0 <= self.path_fraction <= 1.0:
            problems.append(f"path_fraction must be in [0, 1], got {self.path_fraction}")
        if self.window_s <= 0:
            problems.append(f"window_s must be > 0, got {self.window_s}")
        if self.noisy_hosts is not None and self.noisy_hosts < 0:
            problems.append(f"noisy_hosts must be >= 0, got {self.noisy_hosts}")
        lo, hi = self.bg_loss
        if not 0.0 <= lo <= hi < 1.0:
            problems.append(f"bg_loss must be 0 <= low <= high < 1, got {self.bg_loss}")
        if problems:
            raise SimulationError("; ".join(problems))
        parse_faults(self.faults)


def parse_faults(spec: str) -> list[str]:
    """`link_loss:1,switch:2` -> ['link_loss', 'switch_loss', 'switch_loss']; `none` -> []."""
    spec = (spec or "").strip()
    if spec in ("", "none"):
        return []
    kinds: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition(":")
        name = model.ALIASES.get(name.strip(), name.strip())
        if name not in model.FAULT_KINDS:
            known = ", ".join(sorted(model.FAULT_KINDS) + sorted(model.ALIASES))
            raise SimulationError(f"faults: unknown fault kind {part.split(':')[0]!r} (known: {known})")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise SimulationError(f"faults: {part!r}: the count after ':' must be an integer") from None
        if n < 0:
            raise SimulationError(f"faults: {part!r}: the count must be >= 0")
        kinds += [name] * n
    return kinds


def normalize_faults(spec: str) -> str:
    kinds = parse_faults(spec)
    if not kinds:
        return "none"
    order: dict[str, int] = {}
    for k in kinds:
        order[k] = order.get(k, 0) + 1
    return ",".join(f"{k}:{n}" for k, n in order.items())


@dataclass
class Scenario:
    topology: dict[str, Any]
    observations: dict[str, Any]
    truth: dict[str, Any]
    faults: list[dict[str, Any]] = field(default_factory=list)

    def write(self, out_dir: str | Path) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = [out / "topology.json", out / "observations.json", out / "truth.json"]
        files[0].write_text(dump_topology(self.topology))
        files[1].write_text(dump_observations(self.observations))
        files[2].write_text(dump_truth(self.truth))
        return files


# ---- serialization (as the public examples) --------------------------------------------------


def _js(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def dump_observations(doc: dict[str, Any]) -> str:
    head = (f'{{"format":{_js(doc["format"])},"topology":{_js(doc["topology"])},'
            f'"window_s":{_js(doc["window_s"])},"probes":[\n')
    lines = []
    for p in doc["probes"]:
        s = f'{{"src":{_js(p["src"])},"dst":{_js(p["dst"])},"sent":{p["sent"]},"lost":{p["lost"]}'
        if "owd_us" in p:
            s += f',"owd_us":{{"p50":{p["owd_us"]["p50"]:.2f},"p99":{p["owd_us"]["p99"]:.2f}}}'
        if "path" in p:
            s += f',"path":{_js(p["path"])}'
        lines.append(s + "}")
    return head + ",\n".join(lines) + "\n]}\n"


def dump_truth(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


# ---- the fabric as the generator sees it ------------------------------------------------------


def switch_pods(topo: Topology, index: PathIndex) -> np.ndarray:
    """Pod id per switch: connected components of switch-switch links between non-core switches."""
    n = len(index.switch_names)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    core = {i for i, s in enumerate(topo.switches) if s.tier.lower() == "core"}
    for a, b in zip(index.link_switch_a.tolist(), index.link_switch_b.tolist(), strict=True):
        if a >= 0 and b >= 0 and a not in core and b not in core:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)], dtype=np.int64)


def _sample_distinct(
    pool_start: np.ndarray, pool_size: np.ndarray, pool: np.ndarray, need: np.ndarray,
    chosen: np.ndarray, filled: np.ndarray, ok, rng: np.random.Generator,
) -> None:
    """For each row i, add need[i] distinct members of pool[pool_start[i]:+pool_size[i]] that
    pass ok(rows, candidates) and are not yet in chosen[i] (rejection sampling, vectorized)."""
    need = need.copy()
    for _ in range(200 * max(1, int(need.max(initial=0)))):
        act = np.flatnonzero(need > 0)
        if act.size == 0:
            return
        pos = pool_start[act] + (rng.random(len(act)) * pool_size[act]).astype(np.int64)
        cand = pool[pos]
        good = ok(act, cand) & ~np.any(chosen[act] == cand[:, None], axis=1)
        rows, vals = act[good], cand[good]
        chosen[rows, filled[rows]] = vals
        filled[rows] += 1
        need[rows] -= 1
    # stragglers (tiny pools): exhaustive
    for i in np.flatnonzero(need > 0):
        members = pool[pool_start[i]: pool_start[i] + pool_size[i]]
        members = members[ok(np.full(len(members), i), members)]
        members = np.setdiff1d(members, chosen[i][: filled[i]])
        take = rng.permutation(members)[: need[i]]
        chosen[i, filled[i]: filled[i] + len(take)] = take
        filled[i] += len(take)


def choose_pairs(
    index: PathIndex, pods: np.ndarray, config: WindowConfig, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) NIC indices of the probe pairs, sorted by (src name, dst name)."""
    topo = index.topology
    n = len(index.nic_names)
    leaf = index.nic_switch.copy()
    if np.any(leaf < 0):  # multi-homed NICs: use their first attachment for the categories
        for i in np.flatnonzero(leaf < 0):
            att = index._attach[i]
            leaf[i] = att[0][1] if att else -1 - i
    rail = np.array([-1 if nc.rail is None else nc.rail for nc in topo.nics], dtype=np.int64)
    pod = np.where(leaf >= 0, pods[np.maximum(leaf, 0)], leaf)
    # group ids: leaf group, (pod, rail) group
    _, g0 = np.unique(leaf, return_inverse=True)
    _, g1 = np.unique(pod * (rail.max() + 2) + rail + 1, return_inverse=True)
    _, g01 = np.unique(g0 * (g1.max() + 1) + g1, return_inverse=True)
    size0, size1, size01 = np.bincount(g0), np.bincount(g1), np.bincount(g01)
    avail = np.stack([size0[g0] - 1, size1[g1] - size01[g01], n - size0[g0] - size1[g1] + size01[g01]], axis=1)
    k = config.peers_per_nic
    mix = np.array(config.peer_mix, dtype=np.float64) / sum(config.peer_mix)
    want0 = int(round(k * mix[0]))
    want1 = min(int(round(k * mix[1])), k - want0)
    want = np.tile(np.array([want0, want1, k - want0 - want1]), (n, 1))
    take = np.zeros_like(want)
    spill = np.zeros(n, dtype=np.int64)
    for c in (0, 1, 2):  # a category short of candidates hands its share on
        req = want[:, c] + spill
        take[:, c] = np.minimum(req, avail[:, c])
        spill = req - take[:, c]
    for c in (1, 0):  # and what is left over goes back to the closer categories
        t = np.minimum(spill, avail[:, c] - take[:, c])
        take[:, c] += t
        spill -= t
    chosen = np.full((n, max(k, 1)), -1, dtype=np.int64)
    filled = np.zeros(n, dtype=np.int64)
    by0, by1 = np.argsort(g0, kind="stable"), np.argsort(g1, kind="stable")
    start0 = np.concatenate(([0], np.cumsum(size0)))[g0]
    start1 = np.concatenate(([0], np.cumsum(size1)))[g1]
    me = np.arange(n)
    _sample_distinct(start0, size0[g0], by0, take[:, 0], chosen, filled,
                     lambda rows, c: c != me[rows], rng)
    _sample_distinct(start1, size1[g1], by1, take[:, 1], chosen, filled,
                     lambda rows, c: g0[c] != g0[rows], rng)
    _sample_distinct(np.zeros(n, dtype=np.int64), np.full(n, n), me, take[:, 2], chosen, filled,
                     lambda rows, c: (g0[c] != g0[rows]) & (g1[c] != g1[rows]), rng)
    src = np.repeat(me, filled)
    dst = np.concatenate([chosen[i, : filled[i]] for i in range(n)]) if n else np.zeros(0, np.int64)
    names = np.array(index.nic_names)
    order = np.lexsort((names[dst], names[src]))
    return src[order], dst[order]


# ---- identifiability --------------------------------------------------------------------------


class _Signatures:
    """Random projections of every element's incidence vector; equal vectors <=> equal projections
    (with probability 1), so equal rounded projections mean 'indistinguishable by these probes'."""

    def __init__(self, index: PathIndex, inc: Incidence, src: np.ndarray, dst: np.ndarray,
                 sent: np.ndarray, rng: np.random.Generator):
        n_links, n_nics, n_hosts = len(index.link_ids), len(index.nic_names), len(index.host_names)
        self.index = index
        weights = np.stack((rng.random(len(src)) + 0.5, rng.random(len(src)) + 0.5,
                            sent.astype(np.float64)), axis=1)
        fwd, rev, sw = inc.loads(weights)
        nic = np.stack([np.bincount(src, weights[:, c], n_nics) + np.bincount(dst, weights[:, c], n_nics)
                        for c in range(3)], axis=1)
        hs, hd = index.nic_host[src], index.nic_host[dst]
        host = np.stack([np.bincount(hs, weights[:, c], n_hosts) + np.bincount(hd, weights[:, c], n_hosts)
                         for c in range(3)], axis=1)
        table = np.concatenate((fwd + rev, fwd, rev, sw, nic, host))
        projections = [table[:, 0], table[:, 1]]
        self.load = table[:, 2]  # probe traversals with the window's sent counts
        self.labels = (
            [("link", lid, "both") for lid in index.link_ids]
            + [("link", lid, "a-to-b") for lid in index.link_ids]
            + [("link", lid, "b-to-a") for lid in index.link_ids]
            + [("switch", s, None) for s in index.switch_names]
            + [("nic", s, None) for s in index.nic_names]
            + [("host", s, None) for s in index.host_names]
        )
        self.offset = {"link": 0, "switch": 3 * n_links, "nic": 3 * n_links + len(index.switch_names),
                       "host": 3 * n_links + len(index.switch_names) + n_nics}
        self.n_links = n_links
        keys = []
        for p in projections:
            scale = max(float(np.abs(p).max()), 1e-300)
            keys.append(np.round(p / scale, 9))
        key = np.stack(keys, axis=1)
        key[self.load <= 0] = -1.0  # untouched elements are never placed on nor listed
        _, self.group = np.unique(key, axis=0, return_inverse=True)
        self.group = self.group.reshape(-1)
        self.members: dict[int, list[int]] = {}
        for i in np.flatnonzero(self.load > 0):
            self.members.setdefault(int(self.group[i]), []).append(int(i))

    def row(self, kind: str, i: int, direction: str | None = None) -> int:
        if kind == "link":
            return {"both": 0, "a-to-b": 1, "b-to-a": 2}[direction or "both"] * self.n_links + i
        return self.offset[kind] + i

    def equivalent(self, row: int) -> list[tuple[str, str, str | None]]:
        """Other elements with the same signature (a link's own halves are not 'other')."""
        if self.load[row] <= 0:
            return []
        mine = self.labels[row]
        out = []
        for j in self.members.get(int(self.group[row]), []):
            lab = self.labels[j]
            if j == row or (lab[0] == "link" and mine[0] == "link" and lab[1] == mine[1]):
                continue
            out.append(lab)
        return out


def _equivalent_names(labels: list[tuple[str, str, str | None]]) -> list[str]:
    names: list[str] = []
    for kind, name, direction in labels:
        label = name if kind != "link" or direction in (None, "both") else f"{name} ({direction})"
        if label not in names:
            names.append(label)
    return names


# ---- the window -------------------------------------------------------------------------------


def simulate(
    topology: dict[str, Any] | Topology,
    config: WindowConfig,
    topo_params: TopoParams | None = None,
) -> Scenario:
    """One simulated window with ground truth (see the module docstring)."""
    if isinstance(topology, Topology):
        topo = topology
        doc = topology.to_document()
    else:
        doc = topology
        topo = parse_topology(doc)
    if topo_params is None:
        topo_params = params_from_name(topo.name)
    index = PathIndex(topo)
    if not index.connected():
        raise SimulationError(f"topology {topo.name!r}: some NICs cannot reach each other")
    if len(index.nic_names) < 2:
        raise SimulationError(f"topology {topo.name!r}: needs at least two NICs")
    streams = np.random.SeedSequence(config.seed).spawn(9)
    rng_pairs, rng_paths, rng_bg, rng_faults, rng_noise, rng_loss, rng_delay, rng_sig, rng_place = (
        np.random.default_rng(s) for s in streams
    )
    n_links, n_sw = len(index.link_ids), len(index.switch_names)
    n_nics, n_hosts = len(index.nic_names), len(index.host_names)
    nic_host = index.nic_host

    # 1-2. pairs and known paths
    src, dst = choose_pairs(index, switch_pods(topo, index), config, rng_pairs)
    pairs = [(index.nic_names[s], index.nic_names[d]) for s, d in zip(src.tolist(), dst.tolist(), strict=True)]
    has_path = rng_paths.random(len(pairs)) < config.path_fraction
    known_idx = np.flatnonzero(has_path)
    paths: list[tuple[str, ...] | None] = [None] * len(pairs)
    if known_idx.size:
        sampled = index.incidence([pairs[i] for i in known_idx]).sample_paths(rng_paths)
        for i, p in zip(known_idx.tolist(), sampled, strict=True):
            paths[i] = p
    inc = index.incidence(pairs, paths)
    sent = np.full(len(pairs), config.sent, dtype=np.int64)

    # 3. faults
    kinds = parse_faults(config.faults)
    sig = _Signatures(index, inc, src, dst, sent, rng_sig) if kinds else None
    faults = _place_faults(kinds, index, sig, config, rng_faults, rng_place)

    # 4. noise and effects
    faulty_hosts = {f["host"] for f in faults if "host" in f}
    candidates = [h for h in range(n_hosts) if h not in faulty_hosts]
    if config.noisy_hosts is None:
        n_noisy = int(rng_noise.binomial(n_hosts, model.NOISY_HOST_FRACTION))
    else:
        n_noisy = config.noisy_hosts
    n_noisy = min(n_noisy, len(candidates))
    noisy = sorted(rng_noise.choice(candidates, size=n_noisy, replace=False).tolist()) if n_noisy else []
    noisy_params = {h: model.draw_noisy_host(rng_noise) for h in noisy}

    lo, hi = config.bg_loss
    if hi > 0 and lo > 0:
        bg = np.exp(rng_bg.uniform(np.log(lo), np.log(hi), size=(2, n_links)))
    else:
        bg = rng_bg.uniform(lo, hi, size=(2, n_links))
    surv_f, surv_r = 1.0 - bg[0], 1.0 - bg[1]
    surv_sw = np.ones(n_sw)
    access_of_nic = [[lk for lk, _ in index._attach[i]] for i in range(n_nics)]
    nics_of_host = [[] for _ in range(n_hosts)]
    for i, h in enumerate(nic_host.tolist()):
        nics_of_host[h].append(i)

    def scale_access(nic: int, factor: float, inbound_only: bool = False) -> None:
        for lk in access_of_nic[nic]:
            nic_is_a = index.link_switch_a[lk] < 0
            out_dir, in_dir = (surv_f, surv_r) if nic_is_a else (surv_r, surv_f)
            in_dir[lk] *= factor
            if not inbound_only:
                out_dir[lk] *= factor

    congestion: list[tuple[np.ndarray, float, float]] = []  # (x per pair, busy, queue_us)
    delayed_ends = np.zeros((len(pairs), 2))  # host_delay shift per end
    for f in faults:
        kind, p = f["fault"], f["params"]
        if f["target"] == "link":
            k = index.link_index[f["element"]]
            d = p["direction"]
            if d in ("both", "a-to-b"):
                surv_f[k] *= 1.0 - p["drop"]
            if d in ("both", "b-to-a"):
                surv_r[k] *= 1.0 - p["drop"]
            if kind == "link_congestion":
                fw, rv = inc.link_fractions([f["element"]], directed=True)
                x = (fw[:, 0] if d != "b-to-a" else 0.0) + (rv[:, 0] if d != "a-to-b" else 0.0)
                congestion.append((np.asarray(x), p["busy"], p["queue_us"]))
        elif f["target"] == "switch":
            surv_sw[index.switch_index[f["element"]]] *= 1.0 - p["drop"]
        elif f["target"] == "nic":
            scale_access(f["nic"], 1.0 - p["drop"])
        elif f["target"] == "host":
            h = f["host"]
            if kind == "host_loss":
                for i in nics_of_host[h]:
                    scale_access(i, 1.0 - p["drop"])
            elif kind == "host_stall":
                for i in nics_of_host[h]:
                    scale_access(i, 1.0 - p["stall"], inbound_only=True)
                out = nic_host[src] == h
                sent[out] = np.rint(sent[out] * (1.0 - p["stall"])).astype(np.int64)
            elif kind == "host_delay":
                delayed_ends[:, 0] += np.where(nic_host[src] == h, p["shift_us"], 0.0)
                delayed_ends[:, 1] += np.where(nic_host[dst] == h, p["shift_us"], 0.0)

    # loss
    delivery = np.clip(inc.mean_path_product(surv_f, surv_r, surv_sw), 0.0, 1.0)
    lost = rng_loss.binomial(sent, 1.0 - delivery)
    delivered = sent - lost

    # delay
    hops = inc.hops
    p50, p99 = model.healthy_percentiles(hops, np.maximum(delivered, 1), rng_delay)
    tails: list[tuple[np.ndarray, np.ndarray]] = []  # (prob per pair, mean per pair)
    for end in (src, dst):
        prob = np.zeros(len(pairs))
        mean = np.zeros(len(pairs))
        for h, prm in noisy_params.items():
            on = nic_host[end] == h
            prob[on], mean[on] = prm["tail_p"], prm["tail_mean_us"]
        tails.append((prob, mean))
    for x, busy, queue in congestion:
        tails.append((x * busy, np.full(len(pairs), queue)))
    affected = np.zeros(len(pairs), dtype=bool)
    for prob, _ in tails:
        affected |= prob > 0
    affected |= delayed_ends.sum(axis=1) > 0
    affected &= delivered > 0
    _mixture_percentiles(np.flatnonzero(affected), hops, delivered, tails, delayed_ends, p50, p99, rng_delay)

    # 5. documents
    keep = sent > 0
    probes = []
    sent_l, lost_l, deliv_l = sent.tolist(), lost.tolist(), delivered.tolist()
    p50_l, p99_l = np.round(p50, 2).tolist(), np.round(p99, 2).tolist()
    for i in np.flatnonzero(keep).tolist():
        row: dict[str, Any] = {"src": pairs[i][0], "dst": pairs[i][1], "sent": sent_l[i], "lost": lost_l[i]}
        if deliv_l[i] > 0:
            row["owd_us"] = {"p50": p50_l[i], "p99": p99_l[i]}
        if paths[i] is not None:
            row["path"] = list(paths[i])
        probes.append(row)
    observations = {"format": OBS_FORMAT, "topology": topo.name, "window_s": config.window_s, "probes": probes}

    culprits = [_culprit(f, index, inc, sent, src, dst, keep) for f in faults]
    network_ok = not any(c["kind"] in ("link", "switch", "nic") for c in culprits)
    truth = {
        "format": VERDICT_FORMAT,
        "network_ok": network_ok,
        "culprits": culprits,
        "scenario": {
            "topology": topo.name,
            "topo_params": topo_params.as_dict() if topo_params else {},
            "faults_spec": normalize_faults(config.faults),
            "seed": config.seed,
            "peers_per_nic": config.peers_per_nic,
            "peer_mix": list(config.peer_mix),
            "sent": config.sent,
            "path_fraction": config.path_fraction,
            "pairs": len(probes),
            "pairs_with_path": sum(1 for p in probes if "path" in p),
            "identifiable_only": bool(config.identifiable_only and kinds),
            "noisy_hosts": [
                {"host": index.host_names[h], "tail_p": noisy_params[h]["tail_p"],
                 "tail_mean_us": noisy_params[h]["tail_mean_us"]}
                for h in noisy
            ],
            "bg_loss": list(config.bg_loss),
            "window_s": config.window_s,
            "generator": GENERATOR,
        },
    }
    return Scenario(doc, observations, truth, faults)


def _mixture_percentiles(
    rows: np.ndarray, hops: np.ndarray, delivered: np.ndarray,
    tails: list[tuple[np.ndarray, np.ndarray]], delayed_ends: np.ndarray,
    p50: np.ndarray, p99: np.ndarray, rng: np.random.Generator, chunk_samples: int = 2_000_000,
) -> None:
    """Percentiles of pairs whose delays have extra components, by drawing every probe."""
    if rows.size == 0:
        return
    width = int(delivered[rows].max())
    per_chunk = max(1, chunk_samples // width)
    for start in range(0, len(rows), per_chunk):
        r = rows[start: start + per_chunk]
        n = delivered[r]
        cols = np.arange(width)[None, :]
        valid = cols < n[:, None]
        x = np.empty((len(r), width))
        for h in np.unique(hops[r]):
            m = hops[r] == h
            x[m] = model.healthy_delays(int(h), (int(m.sum()), width), rng)
        for prob, mean in tails:
            on = np.flatnonzero(prob[r] > 0)
            if on.size == 0:
                continue
            hit = rng.random((len(on), width)) < prob[r[on]][:, None]
            rows_hit, cols_hit = np.nonzero(hit)
            x[on[rows_hit], cols_hit] += rng.exponential(1.0, len(rows_hit)) * mean[r[on]][rows_hit]
        for e in (0, 1):
            on = np.flatnonzero(delayed_ends[r, e] > 0)
            if on.size:
                shift = np.broadcast_to(delayed_ends[r[on], e][:, None], (len(on), width))
                x[on] += model.host_delay_extra(shift, rng)
        x[~valid] = np.inf
        k50 = model.order_stat_ranks(n, 0.50) - 1
        k99 = model.order_stat_ranks(n, 0.99) - 1
        x.partition(np.unique(np.concatenate((k50, k99))), axis=1)
        p50[r] = x[np.arange(len(r)), k50]
        p99[r] = x[np.arange(len(r)), k99]


# ---- fault placement and culprits -------------------------------------------------------------


def _place_faults(kinds: list[str], index: PathIndex, sig: _Signatures | None, config: WindowConfig,
                  rng_params: np.random.Generator, rng_place: np.random.Generator) -> list[dict[str, Any]]:
    faults: list[dict[str, Any]] = []
    bad_links: set[int] = set()
    bad_switches: set[int] = set()
    bad_nics: set[int] = set()
    bad_hosts: set[int] = set()
    nics_per_host = np.bincount(index.nic_host, minlength=len(index.host_names))
    sw_sw = np.flatnonzero(index.link_kind == 0)
    for kind_name in kinds:
        kind = model.FAULT_KINDS[kind_name]
        params = kind.draw(rng_params)
        fault: dict[str, Any] = {"fault": kind_name, "target": kind.target, "params": params}
        if kind.target == "link":
            cand = [int(k) for k in sw_sw if int(k) not in bad_links
                    and int(index.link_switch_a[k]) not in bad_switches
                    and int(index.link_switch_b[k]) not in bad_switches]
            rows = [sig.row("link", k, params["direction"]) for k in cand] if sig else []
            allowed: list[set[str]] = [set() for _ in cand]
        elif kind.target == "switch":
            touched = {int(index.link_switch_a[k]) for k in bad_links} | {int(index.link_switch_b[k]) for k in bad_links}
            cand = [s for s in range(len(index.switch_names)) if s not in bad_switches and s not in touched]
            rows = [sig.row("switch", s) for s in cand] if sig else []
            allowed = [set() for _ in cand]
        elif kind.target == "nic":
            faulty_per_host = np.bincount(index.nic_host[list(bad_nics)], minlength=len(index.host_names)) \
                if bad_nics else np.zeros(len(index.host_names), dtype=np.int64)
            cand = [i for i in range(len(index.nic_names)) if i not in bad_nics
                    and int(index.nic_host[i]) not in bad_hosts
                    and faulty_per_host[index.nic_host[i]] + 1 < nics_per_host[index.nic_host[i]]]
            rows = [sig.row("nic", i) for i in cand] if sig else []
            allowed = [{index.link_ids[lk] for lk, _ in index._attach[i]} for i in cand]
        else:
            hosts_with_bad_nic = {int(index.nic_host[i]) for i in bad_nics}
            cand = [h for h in range(len(index.host_names)) if h not in bad_hosts and h not in hosts_with_bad_nic]
            rows = [sig.row("host", h) for h in cand] if sig else []
            allowed = [set() for _ in cand]
        if config.identifiable_only and sig is not None:
            keep = []
            for j, r in enumerate(rows):
                if sig.load[r] < config.sent:  # less than one pair's worth of probes
                    continue
                others = {name for _, name, _ in sig.equivalent(r)}
                if others <= allowed[j]:
                    keep.append(j)
            cand = [cand[j] for j in keep]
            rows = [rows[j] for j in keep]
        if not cand:
            why = " that these probes can identify (try a larger path fraction, or --any-place)" \
                if config.identifiable_only else ""
            raise SimulationError(f"faults: no place left for a {kind_name} fault{why}")
        j = int(rng_place.integers(len(cand)))
        el = cand[j]
        if sig is not None:
            fault["equivalent"] = _equivalent_names(sig.equivalent(rows[j]))
        if kind.target == "link":
            bad_links.add(el)
            fault["element"] = index.link_ids[el]
            fault["culprit"] = ("link", index.link_ids[el])
        elif kind.target == "switch":
            bad_switches.add(el)
            fault["element"] = index.switch_names[el]
            fault["culprit"] = ("switch", index.switch_names[el])
        elif kind.target == "nic":
            bad_nics.add(el)
            fault["nic"] = el
            access = [index.link_ids[lk] for lk, _ in index._attach[el]]
            on_link = bool(access) and rng_place.random() < 0.5
            fault["element"] = access[int(rng_place.integers(len(access)))] if on_link else index.nic_names[el]
            fault["culprit"] = ("nic", index.nic_names[el])
        else:
            bad_hosts.add(el)
            fault["host"] = el
            fault["element"] = index.host_names[el]
            fault["culprit"] = ("host", index.host_names[el])
        faults.append(fault)
    return faults


def _culprit(fault: dict[str, Any], index: PathIndex, inc: Incidence, sent: np.ndarray,
             src: np.ndarray, dst: np.ndarray, reported: np.ndarray) -> dict[str, Any]:
    """The truth entry of a fault; its counts cover the pairs the window reports."""
    kind, name = fault["culprit"]
    p = fault["params"]
    if fault["target"] == "link":
        fw, rv = inc.link_fractions([name], directed=True)
        d = p["direction"]
        x = (fw[:, 0] if d != "b-to-a" else 0.0) + (rv[:, 0] if d != "a-to-b" else 0.0)
    elif fault["target"] == "switch":
        x = inc.switch_fractions([name])[:, 0]
    elif fault["target"] == "nic":
        x = inc.nic_counts([name])[:, 0]
    elif fault["fault"] == "host_stall":
        x = (index.nic_host[dst] == fault["host"]).astype(np.float64)
    else:
        x = inc.host_counts([name])[:, 0]
    x = np.asarray(x, dtype=np.float64)
    touched = x > 0
    if fault["fault"] == "host_stall":
        touched = touched | (index.nic_host[src] == fault["host"])
    touched &= reported
    traversals = float((sent * x).sum())
    out: dict[str, Any] = {"kind": kind, "name": name, "confidence": 1.0, "fault": fault["fault"],
                           "drop": p["drop"]}
    for key in ("direction", "busy", "queue_us", "stall", "shift_us"):
        if key in p:
            out[key] = p[key]
    if out.get("direction") in ("a-to-b", "b-to-a"):
        k = index.link_index[name]
        a, b = index.link_a[k], index.link_b[k]
        out["from"], out["to"] = (a, b) if out["direction"] == "a-to-b" else (b, a)
    if fault["element"] != name:
        out["element"] = fault["element"]
    out["pairs_touched"] = int(touched.sum())
    out["probe_traversals"] = round(traversals, 1)
    out["expected_drops"] = round(traversals * p["drop"], 1)
    out["equivalent"] = fault.get("equivalent", [])
    return out
