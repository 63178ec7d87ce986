"""Path discovery: which links each probe flow (a NIC, a peer, a source port) takes.

Like traceroute (and Paris traceroute: the flow's own 5-tuple, so ECMP hashes it onto the same
path as its probes), the engine sends the flow's probe with TTL 1, 2, ... from the flow's own
socket; each switch on the way answers ICMP time exceeded from its address, which the socket
reads from its error queue (``IP_RECVERR``: no raw socket), and the peer's responder answers the
probe that reaches it. The plan's ``routers`` maps an answering address to ``[device, link]``:
the device and the link a probe arrives on at that address (a switch that answers from the
address of its ingress port, as Linux does with ``icmp_errors_use_inbound_ifaddr``, names its
ingress link; one that answers from a loopback gives only its name). The peer's own address
maps to its access link, so a fully mapped path is the link list of ``lockstep.observations/v1``.

All TTLs of a trace go at once; a switch that quotes only the UDP header in its ICMP error
(so the answer does not say which TTL it answers) turns the discovery to one TTL at a time.
Flows are traced round-robin over the peers (every peer gets its first flows early), at
``traces_per_s``, refreshed every ``refresh_s``; a flow that loses probes is traced again first
(at most every ``URGENT_EVERY_S``), and a new trace that fails keeps the path learned before.
Pure state machine: the caller sends what :meth:`PathDiscovery.due` returns and feeds the
engine's ``hop`` events to :meth:`PathDiscovery.on_hop`.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from agent.probemesh.plan import EngineConfig

ATTEMPTS = 3
URGENT_EVERY_S = 10.0


@dataclass(frozen=True)
class Route:
    hops: tuple[str, ...]  # the answering address at TTL 1, 2, ...; the last is the peer
    links: tuple[str, ...] | None  # every hop mapped to a link
    devices: tuple[str, ...] | None  # every hop mapped to a device
    learned_at: float

    def to_json(self) -> dict:
        out: dict = {"hops": list(self.hops)}
        if self.links is not None:
            out["path"] = list(self.links)
        if self.devices is not None:
            out["devices"] = list(self.devices)
        return out


@dataclass
class _Trace:
    token: int
    flow: tuple  # (nic name, peer name, peer address, sport index)
    peer_i: int
    sport_i: int
    started: float
    max_ttl: int
    attempt: int = 1
    answers: dict = field(default_factory=dict)  # ttl -> address
    reached: int | None = None
    pending: list = field(default_factory=list)  # ttls not sent yet (one at a time in serial mode)
    inflight: set = field(default_factory=set)
    sent_at: float = 0.0


class PathDiscovery:
    def __init__(self, settings: dict, routers: dict):
        self.settings = dict(settings)
        self.routers = dict(routers)
        self.routes: dict[tuple, Route] = {}
        self.failed: dict[tuple, float] = {}
        self.traced_at: dict[tuple, float] = {}
        self.urgent: deque = deque()
        self._urgent_at: dict[tuple, float] = {}
        self.active: dict[int, _Trace] = {}
        self._by_flow: dict[tuple, _Trace] = {}
        self._tokens = itertools.count(1)
        self._order: list[tuple] = []
        self._cursor = 0
        self._budget = 0.0
        self._last: float | None = None
        self._reach: dict[tuple, int] = {}  # (nic, peer) -> TTL at which the peer answered
        self.serial = False
        self._single: dict[tuple, Route | None] = {}
        self.index: dict[tuple, int] = {}  # (nic, peer, address) -> peer index
        self.flow_of_sport: dict[tuple, tuple] = {}
        self.nic_names: list[str] = []
        self.sport_count = 1

    # -- configuration -----------------------------------------------------------------------
    def configure(self, cfg: EngineConfig) -> None:
        self.settings = dict(cfg.paths)
        self.routers = dict(cfg.routers)
        self.sport_count = cfg.sport_count
        self.nic_names = [n.name for n in cfg.nics]
        self.index = {(cfg.nics[n].name, name, addr): i for i, (n, name, addr) in enumerate(cfg.peers)}
        flows = [(cfg.nics[n].name, name, addr, s) for s in range(cfg.sport_count) for (n, name, addr) in cfg.peers]
        keep = set(flows)
        for table in (self.routes, self.failed, self.traced_at, self._urgent_at):
            for key in [k for k in table if k not in keep]:
                del table[key]
        for token in [t for t, tr in self.active.items() if tr.flow not in keep or tr.flow[:3] not in self.index]:
            self._drop(token)
        for tr in self.active.values():
            tr.peer_i = self.index[tr.flow[:3]]
        self.urgent = deque(f for f in self.urgent if f in keep)
        self._single.clear()
        self._order = flows
        self._cursor = 0

    # -- what to send ----------------------------------------------------------------------------
    def due(self, now: float) -> list[tuple[int, int, int, int]]:
        """(token, peer index, sport index, ttl) of the trace probes to send now."""
        out: list[tuple[int, int, int, int]] = []
        if not self.settings.get("enabled") or not self._order:
            return out
        self._expire(now)
        rate = float(self.settings["traces_per_s"])
        if self._last is None:
            self._budget = min(1.0, rate)  # the first trace goes at once
        else:
            self._budget = min(max(1.0, rate), self._budget + rate * (now - self._last))
        self._last = now
        while self._budget >= 1.0 and len(self.active) < max(4, int(rate)):
            flow = self._next_flow(now)
            if flow is None:
                break
            self._budget -= 1.0
            self._start(flow, now)
        for tr in self.active.values():
            out.extend(self._send(tr, now))
        return out

    def _next_flow(self, now: float) -> tuple | None:
        while self.urgent:
            flow = self.urgent.popleft()
            if flow not in self._by_flow:
                return flow
        refresh = float(self.settings["refresh_s"])
        for _ in range(len(self._order)):
            flow = self._order[self._cursor]
            self._cursor = (self._cursor + 1) % len(self._order)
            if flow in self._by_flow:
                continue
            if flow in self.failed:
                if now - self.failed[flow] >= refresh / 4:
                    return flow
                continue
            at = self.traced_at.get(flow)
            if at is None or now - at >= refresh:
                return flow
        return None

    def _start(self, flow: tuple, now: float) -> None:
        token = next(self._tokens) & 0xFFFFFFFF or next(self._tokens)
        reach = self._reach.get(flow[:2])
        max_ttl = int(self.settings["max_ttl"])
        top = min(max_ttl, reach) if reach else max_ttl
        tr = _Trace(token, flow, self.index[flow[:3]], flow[3], now, top)
        tr.pending = list(range(1, top + 1))
        self.active[token] = tr
        self._by_flow[flow] = tr
        self.traced_at[flow] = now

    def _send(self, tr: _Trace, now: float) -> list[tuple[int, int, int, int]]:
        if not tr.pending or (self.serial and tr.inflight):
            return []
        ttls = [tr.pending.pop(0)] if self.serial else list(tr.pending)
        if not self.serial:
            tr.pending = []
        tr.inflight.update(ttls)
        tr.sent_at = now
        return [(tr.token, tr.peer_i, tr.sport_i, t) for t in ttls]

    # -- answers ---------------------------------------------------------------------------------
    def on_hop(self, ev: dict, now: float) -> None:
        token = ev.get("token")
        if token is None:
            tr = self._match_by_flow(ev)
            if tr is None:
                return
            if len(tr.inflight) != 1:  # which TTL is this? go one at a time from now on
                self.serial = True
                tr.pending = sorted(set(range(1, tr.max_ttl + 1)) - set(tr.answers))
                tr.inflight.clear()
                return
            ttl = next(iter(tr.inflight))
        else:
            tr = self.active.get(int(token))
            ttl = ev.get("ttl")
            if tr is None or not isinstance(ttl, int):
                return
        tr.inflight.discard(ttl)
        if ev.get("kind") == "reached":
            tr.reached = ttl if tr.reached is None else min(tr.reached, ttl)
            tr.answers[ttl] = ev.get("from")
        elif ev.get("kind") == "ttl":
            tr.answers[ttl] = ev.get("from")
        else:  # unreachable on the way: this flow has no path now
            tr.answers[ttl] = ev.get("from")
            tr.reached = None
            tr.pending = []
            tr.inflight.clear()
            tr.attempt = ATTEMPTS
            self._finish(tr, now)
            return
        if tr.reached is not None and all(t in tr.answers for t in range(1, tr.reached)):
            self._finish(tr, now)

    def _match_by_flow(self, ev: dict) -> _Trace | None:
        nic_i, sport = ev.get("nic"), ev.get("sport")
        if not isinstance(nic_i, int) or not 0 <= nic_i < len(self.nic_names):
            return None
        nic = self.nic_names[nic_i]
        for tr in self.active.values():
            if tr.flow[0] == nic and tr.flow[3] == sport and tr.flow[2] == ev.get("dst"):
                return tr
        return None

    def _expire(self, now: float) -> None:
        timeout = float(self.settings["timeout_ms"]) / 1000.0
        for tr in list(self.active.values()):
            if not tr.inflight and tr.pending:
                continue  # waiting its turn to send (serial)
            if now - tr.sent_at < timeout:
                continue
            if self.serial and tr.inflight and tr.reached is None:
                # one TTL at a time: a silent hop is skipped; the next TTL may still answer
                tr.inflight.clear()
                if not tr.pending:
                    self._retry_or_finish(tr, now)
                continue
            self._retry_or_finish(tr, now)

    def _retry_or_finish(self, tr: _Trace, now: float) -> None:
        if tr.attempt >= ATTEMPTS:
            self._finish(tr, now)
            return
        tr.attempt += 1
        tr.inflight.clear()
        top = tr.reached if tr.reached is not None else int(self.settings["max_ttl"])
        tr.max_ttl = max(tr.max_ttl, top)
        tr.pending = [t for t in range(1, top + 1) if t not in tr.answers]

    def _finish(self, tr: _Trace, now: float) -> None:
        self._drop(tr.token)
        if tr.reached is None or any(t not in tr.answers for t in range(1, tr.reached + 1)):
            if tr.flow not in self.routes:  # a failed new trace keeps the path learned before
                self.failed[tr.flow] = now
            return
        hops = tuple(tr.answers[t] for t in range(1, tr.reached + 1))
        self._reach[tr.flow[:2]] = tr.reached
        mapped = [self.routers.get(h) for h in hops]
        links = tuple(m[1] for m in mapped) if all(m and m[1] for m in mapped) else None
        devices = tuple(m[0] for m in mapped) if all(mapped) else None
        self.routes[tr.flow] = Route(hops, links, devices, now)
        self.failed.pop(tr.flow, None)
        self._single.pop(tr.flow[:3], None)

    def _drop(self, token: int) -> None:
        tr = self.active.pop(token, None)
        if tr is not None:
            self._by_flow.pop(tr.flow, None)

    # -- use -----------------------------------------------------------------------------------
    def mark_lossy(self, nic: str, peer: str, addr: str, sports: list[int], now: float) -> None:
        """Trace these flows first: their paths matter now."""
        for s in sports:
            flow = (nic, peer, addr, s)
            if flow in self._by_flow or now - self._urgent_at.get(flow, -1e18) < URGENT_EVERY_S:
                continue
            self._urgent_at[flow] = now
            self.urgent.append(flow)

    def route(self, nic: str, peer: str, addr: str, sport: int) -> Route | None:
        return self.routes.get((nic, peer, addr, sport))

    def single_route(self, nic: str, peer: str, addr: str) -> Route | None:
        """The route every port of this pair takes, when all are known and the same."""
        key = (nic, peer, addr)
        if key not in self._single:
            first = None
            for s in range(self.sport_count):
                r = self.routes.get((nic, peer, addr, s))
                if r is None or (first is not None and r.hops != first.hops):
                    first = None
                    break
                first = first or r
            self._single[key] = first
        return self._single[key]

    def stats(self) -> dict:
        return {"flows": len(self._order), "known": len(self.routes), "mapped": sum(
            1 for r in self.routes.values() if r.links is not None), "tracing": len(self.active),
            "failed": len(self.failed), "serial": self.serial}
