"""An engine's ``window`` event -> the ``probe.window`` telemetry record (pure).

One record per local NIC and window; its ``probes`` entries are shaped like the entries of
``lockstep.observations/v1`` (``src``, ``dst``, ``sent``, ``lost``, ``owd_us``, ``path``) plus what
a converter needs to merge a cluster's records into one observation window
(``workers.probemesh.observations``). The shape is documented in docs/agent-protocol.md,
"Probe mesh".
"""

from __future__ import annotations

from collections import Counter

from agent.probemesh.paths import PathDiscovery
from agent.probemesh.plan import EngineConfig

FORMAT = "lockstep.probe.window/v1"
MAX_PATHS = 64  # per entry


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


def _pcts(v: list | None, halve: bool = False) -> dict | None:
    if not v:
        return None
    div = 2000.0 if halve else 1000.0
    return {"p50": round(v[0] / div, 3), "p99": round(v[1] / div, 3)}


def record(ev: dict, cfg: EngineConfig, engine: str, paths: PathDiscovery | None = None,
           interval_ns: int | None = None) -> tuple[dict, list[tuple[int, list[int]]]]:
    """The telemetry record of one window event, and the (peer index, source ports) that lost
    probes (for path discovery to trace first)."""
    nic = cfg.nics[ev["nic"]]
    interval = interval_ns or cfg.interval_ns
    probes: list[dict] = []
    lossy: list[tuple[int, list[int]]] = []
    for p in ev["peers"]:
        _, peer, addr = cfg.peers[p["i"]]
        clock = p["basis"] == "clock"
        fwd = {"src": nic.name, "dst": peer, "via": "probe", "sent": p["sent"], "lost": p["lost"],
               "unresolved": p["unres"], "late": p["late"], "refused": p["refused"],
               "send_errors": p["send_errors"], "answered": p["answered"], "deadline_us": _us(p["deadline_ns"]),
               "timestamps": "hardware" if p.get("hw") else (
                   "software" if engine == "native" and cfg.txts else "software-rx")}
        rev = {"src": peer, "dst": nic.name, "via": "echo", "sent": p["rsent"], "lost": p["rlost"], "late": p["rlate"]}
        rtt = p.get("rtt")
        if rtt:
            fwd["rtt_us"] = _pcts(rtt)
        for entry, key in ((fwd, "fwd"), (rev, "rev")):
            if clock and p.get(key):
                entry["owd_us"], entry["owd_samples"] = _pcts(p[key]), p[key][2]
                entry["owd_basis"] = "clock"
            elif rtt:
                entry["owd_us"], entry["owd_samples"] = _pcts(rtt, halve=True), rtt[2]
                entry["owd_basis"] = "half_rtt"
        if paths is not None:
            single = paths.single_route(nic.name, peer, addr)
            if single is not None and single.links is not None:
                fwd["path"] = list(single.links)
            if p.get("sports"):
                fwd["paths"] = _by_path(p, cfg, paths, nic.name, peer, addr)
        if p.get("sports"):
            lossy.append((p["i"], [s[0] for s in p["sports"]]))
        probes.append(fwd)
        probes.append(rev)
    rec = {"format": FORMAT, "nic": nic.name, "start_ns": ev["start_ns"], "window_s": ev["window_ns"] / 1e9,
           "clock": "cluster" if ev.get("synced") else "local", "interval_ms": interval / 1e6, "engine": engine,
           "probes": probes,
           "received": [{"src": src, "start_ns": start, "probes": n} for src, start, n in ev.get("rx", [])],
           "received_late": ev.get("rx_late", 0)}
    return rec, lossy


def _by_path(p: dict, cfg: EngineConfig, paths: PathDiscovery, nic: str, peer: str, addr: str) -> list[dict]:
    """The forward probes of a lossy pair by the path each source port took (unknown: null)."""
    count = cfg.sport_count
    step, off, seq0 = p["sport_step"], p["sport_off"], p["seq0"]
    sent = Counter(((seq0 + k) % 2**32 * step + off) % count for k in range(p["sent"]))
    lost = {s: lf + un for s, lf, _lr, un in p["sports"]}
    groups: dict[tuple | None, dict] = {}
    for sport, n in sent.items():
        route = paths.route(nic, peer, addr, sport)
        key = route.hops if route is not None else None
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"sent": 0, "lost": 0, "ports": 0, **(route.to_json() if route else {"path": None})}
        g["sent"] += n
        g["lost"] += lost.get(sport, 0)
        g["ports"] += 1
    ordered = sorted(groups.values(), key=lambda g: (-g["lost"], -g["sent"]))
    return ordered[:MAX_PATHS]
