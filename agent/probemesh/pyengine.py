"""The Python engine: the same probes, echoes and windows as the native helper, at a lower rate.

Used where ``lockstep-probed`` is not built. It speaks the helper's wire format
(:mod:`agent.probemesh.wire`), so a host running it probes and answers hosts running the
helper, and it prints the same events. What it gives up, and says in the agent's health:

- its rate is capped at :data:`RATE_CAP` probes per second for the whole host: a plan asking
  more has its interval stretched (every peer is still probed, less often);
- transmit times are user-space clock reads just before ``sendto`` (the receive times are
  kernel stamps, ``SO_TIMESTAMPNS``), and there are no hardware stamps;
- its own echoes carry no follow-up TX stamps.

It runs in the caller's thread: :meth:`PythonEngine.events` runs the loop for up to its
timeout and returns what happened.
"""

from __future__ import annotations

import errno
import ipaddress
import math
import os
import random
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

from agent.probemesh import wire
from agent.probemesh.plan import EngineConfig

RATE_CAP = 2000.0
UNKNOWN_ADDR = str(ipaddress.IPv4Address(0))  # an ICMP error without its sender, as the helper prints it
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
SO_EE_ORIGIN_ICMP = 2
_TIMESPEC = struct.Struct("@qq")
_EXT_ERR = struct.Struct("=IBBBBII")  # struct sock_extended_err
SLOTS = 8
MASK_BITS = 64


def _now_real() -> int:
    return time.time_ns()


def _now_mono() -> int:
    return time.monotonic_ns()


@dataclass
class _Rec:
    seq: int
    sport: int
    window_ns: int
    tx_mono: int
    deadline_ns: int
    a_synced: bool
    a_offset: int
    tx: int
    send_error: bool = False
    final: bool = False
    answered: bool = False
    known: bool = False
    b_seen: bool = False
    refused: bool = False
    b_synced: bool = False
    rx_a: int = 0
    rx_b: int = 0
    tx_b: int = 0


@dataclass
class _Acc:
    window_ns: int
    seq0: int = 0
    sent: int = 0
    lost: int = 0
    unres: int = 0
    late: int = 0
    refused: int = 0
    send_errors: int = 0
    rsent: int = 0
    rlost: int = 0
    rlate: int = 0
    answered: int = 0
    clock_ok: int = 0
    fwd: list = field(default_factory=list)
    rev: list = field(default_factory=list)
    rtt: list = field(default_factory=list)
    sports: dict = field(default_factory=dict)  # sport -> [fwd, rev, unresolved]


class _Peer:
    def __init__(self, index: int, nic: int, name: str, addr: str, nic_name: str, count: int, deadline: int):
        self.index, self.nic, self.name, self.addr, self.nic_name = index, nic, name, addr, nic_name
        self.session = random.getrandbits(32) or 1
        self.next_seq = random.getrandbits(24)
        self.final_seq = self.next_seq
        self.recs: dict[int, _Rec] = {}
        self.accs: dict[int, _Acc] = {}
        self.deadline_ns = deadline
        self.sport_off = random.randrange(count)
        self.sport_step = 1
        if count > 2:
            while True:
                self.sport_step = random.randrange(1, count)
                if math.gcd(self.sport_step, count) == 1:
                    break
        self.next_due = 0

    def key(self) -> tuple:
        return (self.nic_name, self.name, self.addr)


class _Flow:
    __slots__ = ("name", "have", "max_seq", "seen", "last", "rx")

    def __init__(self, name: str, now: int):
        self.name, self.have, self.max_seq, self.seen, self.last = name, False, 0, 0, now
        self.rx: dict[int, int] = {}

    def update(self, seq: int) -> None:
        if not self.have:
            self.have, self.max_seq, self.seen = True, seq, 0
            return
        d = ((seq - self.max_seq + 2**31) % 2**32) - 2**31
        if d > 0:
            seen = (self.seen << d) & (2**64 - 1) if d < 64 else 0
            if d - 1 < 64:
                seen |= 1 << (d - 1)
            self.seen, self.max_seq = seen, seq
        elif 0 < -d <= 64:
            self.seen |= 1 << (-d - 1)

    def before(self, seq: int) -> int:
        d = (self.max_seq - seq) % 2**32
        return self.seen >> d if d < 64 else 0


class _Nic:
    def __init__(self, index: int, plan, cfg: EngineConfig, errors: list[str]):
        self.index, self.name, self.ifname, self.address = index, plan.name, plan.interface, plan.address
        self.sport_first, self.sport_count = cfg.sport_first, cfg.sport_count
        self.errors: list[str] = []
        self.flows: dict[tuple[str, int], _Flow] = {}
        self.next_emit = 0
        self.rx_late = 0
        self.resp = self._socket(cfg.port, cfg)
        self.sports: list[socket.socket] | None = []
        for i in range(cfg.sport_count):
            s = self._socket(cfg.sport_first + i, cfg)
            if s is None:
                for o in self.sports:
                    o.close()
                self.sports = None
                break
            self.sports.append(s)
        errors.extend(self.errors)

    def key(self, cfg: EngineConfig) -> tuple:
        return (self.name, self.ifname, self.address, self.sport_first, self.sport_count)

    def _socket(self, port: int, cfg: EngineConfig) -> socket.socket | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.ifname:
                try:
                    s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, self.ifname.encode())
                except OSError as exc:
                    msg = f"SO_BINDTODEVICE {self.ifname}: {exc.strerror}; bound by address only"
                    if msg not in self.errors:
                        self.errors.append(msg)
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
            if cfg.dscp:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, cfg.dscp << 2)
            s.bind((self.address, port))
            s.setblocking(False)
            return s
        except OSError as exc:
            self.errors.append(f"bind {self.address}:{port}: {exc.strerror or exc}")
            s.close()
            return None

    def close(self) -> None:
        for s in [self.resp, *(self.sports or [])]:
            if s is not None:
                s.close()


class PythonEngine:
    kind = "python"

    def __init__(self, rate_cap: float = RATE_CAP):
        self.rate_cap = rate_cap
        self.cfg: EngineConfig | None = None
        self.nics: list[_Nic] = []
        self.peers: list[_Peer] = []
        self.sessions: dict[int, _Peer] = {}
        self.sel = selectors.DefaultSelector()
        self.offset, self.synced = 0, False
        self.interval_ns = 0
        self.degraded: str | None = None
        self.missing: str | None = None  # why the native helper is not used (set by the runner)
        self.out: list[dict] = []
        self.stats = {"sent": 0, "echoes": 0, "answered_probes": 0, "stale_echoes": 0, "tx_stamps": 0,
                      "send_errors": 0, "skipped": 0, "bad_packets": 0, "traces": 0, "hops": 0, "windows": 0,
                      "windows_skipped": 0, "out_dropped": 0}
        self._next_stats = _now_mono() + 1_000_000_000
        self._cpu0 = time.thread_time_ns()
        self.out.append({"ev": "ready", "version": "py1", "wire": wire.VERSION, "pid": os.getpid()})

    # -- configuration ---------------------------------------------------------------------------
    def apply(self, cfg: EngineConfig) -> None:
        old = self.cfg
        keep_sockets = old is not None and (old.port, old.dscp) == (cfg.port, cfg.dscp)
        keep_peers = keep_sockets and (old.window_ns, old.interval_ns, old.deadline_max_ns, old.grace_ns) == (
            cfg.window_ns, cfg.interval_ns, cfg.deadline_max_ns, cfg.grace_ns)
        self.cfg = cfg
        old_nics = {n.key(cfg): n for n in self.nics} if keep_sockets else {}
        for n in self.nics:
            if n.key(cfg) not in old_nics:
                self._close_nic(n)
        nics, kept, errors = [], set(), []
        wanted = {(p.name, p.interface, p.address, cfg.sport_first, cfg.sport_count) for p in cfg.nics}
        for key, n in list(old_nics.items()):
            if key not in wanted:
                self._close_nic(n)
                del old_nics[key]
        for i, plan in enumerate(cfg.nics):
            key = (plan.name, plan.interface, plan.address, cfg.sport_first, cfg.sport_count)
            nic = old_nics.get(key)
            if nic is not None:
                kept.add(i)
                nic.index = i
            else:
                nic = _Nic(i, plan, cfg, errors)
                for s in [nic.resp, *(nic.sports or [])]:
                    if s is not None:
                        self.sel.register(s, selectors.EVENT_READ, nic)
            if not keep_peers:
                nic.next_emit = 0
            nics.append(nic)
        self.nics = nics
        # the rate cap: every peer is still probed, less often
        self.interval_ns = cfg.interval_ns
        need = len(cfg.peers) * 1e9 / cfg.interval_ns if cfg.interval_ns else 0
        self.degraded = None
        if need > self.rate_cap:
            self.interval_ns = int(math.ceil(len(cfg.peers) * 1e9 / self.rate_cap))
            self.degraded = (f"python engine: {need:,.0f} probes/s asked, capped at {self.rate_cap:,.0f}; "
                             f"interval stretched from {cfg.interval_ns / 1e6:g} ms to {self.interval_ns / 1e6:g} ms")
        old_peers = {p.key(): p for p in self.peers} if keep_peers else {}
        peers, now = [], _now_mono()
        for i, (nic_i, name, addr) in enumerate(cfg.peers):
            nic = nics[nic_i]
            p = old_peers.pop((nic.name, name, addr), None) if nic_i in kept else None
            if p is None:
                p = _Peer(i, nic_i, name, addr, nic.name, cfg.sport_count, cfg.deadline_max_ns)
                p.next_due = now + random.randrange(max(1, self.interval_ns))
            p.index, p.nic = i, nic_i
            peers.append(p)
        self.peers = peers
        self.sessions = {p.session: p for p in peers}
        self.out.append({"ev": "config", "peers": len(peers), "nics": [
            {"i": n.index, "hw": 0, "responder": n.resp is not None, "probing": n.sports is not None,
             "sockets": (n.resp is not None) + len(n.sports or []), "errors": "; ".join(n.errors)} for n in nics]})

    def _close_nic(self, nic: _Nic) -> None:
        for s in [nic.resp, *(nic.sports or [])]:
            if s is not None:
                self.sel.unregister(s)
        nic.close()

    def set_clock(self, offset_ns: int, synced: bool) -> None:
        self.offset, self.synced = int(offset_ns), bool(synced)

    def _wclock(self) -> int:
        return _now_real() + (self.offset if self.synced else 0)

    # -- the loop ----------------------------------------------------------------------------------
    def events(self, timeout: float) -> list[dict]:
        end = _now_mono() + int(max(0.0, timeout) * 1e9)
        while True:
            now = _now_mono()
            due = min((p.next_due for p in self.peers if self.nics[p.nic].sports), default=end)
            wait = max(0, min(due, end, now + 1_000_000) - now)
            for key, _ in self.sel.select(wait / 1e9):
                self._readable(key.fileobj, key.data)
            now = _now_mono()
            self._send_due(now)
            self._tick(now)
            if self.cfg is not None:
                self._emit_windows(self._wclock())
            if now >= self._next_stats:
                self.out.append({"ev": "stats", **self.stats, "cpu_ns": time.thread_time_ns() - self._cpu0,
                                 "peers": len(self.peers), "nics": len(self.nics)})
                self._next_stats = now + 1_000_000_000
            if self.out or now >= end:
                out, self.out = self.out, []
                return out

    def _send_due(self, now: int) -> None:
        cfg = self.cfg
        for p in self.peers:
            nic = self.nics[p.nic]
            if p.next_due > now or not nic.sports:
                continue
            if now - p.next_due > 2 * self.interval_ns + 20_000_000:
                missed = (now - p.next_due) // self.interval_ns
                self.stats["skipped"] += missed
                p.next_due += missed * self.interval_ns
            p.next_due += self.interval_ns
            seq = p.next_seq
            sport = (seq * p.sport_step + p.sport_off) % cfg.sport_count
            wclock = self._wclock()
            window = wclock - wclock % cfg.window_ns
            tx = _now_real()
            data = wire.probe(wire.PROBE, p.session, seq, window, tx + (self.offset if self.synced else 0),
                              nic.name, self.synced, cfg.payload)
            send_error = False
            try:
                nic.sports[sport].sendto(data, (p.addr, cfg.port))
            except (BlockingIOError, InterruptedError):
                self.stats["skipped"] += 1
                continue
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.stats["skipped"] += 1
                    continue
                send_error = True
                self.stats["send_errors"] += 1
            rec = _Rec(seq, sport, window, now, p.deadline_ns, self.synced, self.offset if self.synced else 0, tx,
                       send_error=send_error)
            p.recs[seq] = rec
            acc = self._acc(p, window)
            if acc is not None:
                if not acc.sent:
                    acc.seq0 = seq
                acc.sent += 1
            p.next_seq = (seq + 1) % 2**32
            self.stats["sent"] += 1

    def _acc(self, p: _Peer, window: int) -> _Acc | None:
        nic = self.nics[p.nic]
        if nic.next_emit and window < nic.next_emit:
            return None
        acc = p.accs.get(window)
        if acc is None:
            acc = p.accs[window] = _Acc(window)
        return acc

    def _readable(self, sock: socket.socket, nic: _Nic) -> None:
        self._errqueue(sock, nic)
        for _ in range(64):
            try:
                data, anc, _flags, addr = sock.recvmsg(65536, 256)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # a pending ICMP error reported on the normal path: read from the queue above
            rx = None
            for level, ctype, cdata in anc:
                if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS and len(cdata) >= _TIMESPEC.size:
                    sec, nsec = _TIMESPEC.unpack_from(cdata)
                    rx = sec * 1_000_000_000 + nsec
            rx = rx or _now_real()
            msg = wire.parse(data)
            if msg is None:
                self.stats["bad_packets"] += 1
                continue
            if sock is nic.resp:
                self._answer(sock, nic, msg, data, addr, rx)
            elif msg.type == wire.ECHO:
                self._echo(msg, rx)
            elif msg.type == wire.TRACE_ECHO:
                self._hop(msg.session, msg.seq, addr[0], "reached", 0, nic, sock, addr[0])
            else:
                self.stats["bad_packets"] += 1

    def _errqueue(self, sock: socket.socket, nic: _Nic) -> None:
        for _ in range(64):
            try:
                data, anc, _flags, addr = sock.recvmsg(2048, 512, MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError, OSError):
                return
            ee = offender = None
            for level, ctype, cdata in anc:
                if level == socket.IPPROTO_IP and ctype == IP_RECVERR and len(cdata) >= _EXT_ERR.size:
                    ee = _EXT_ERR.unpack_from(cdata)
                    if len(cdata) >= _EXT_ERR.size + 8:
                        family, _port = struct.unpack_from("=HH", cdata, _EXT_ERR.size)
                        if family == socket.AF_INET:
                            offender = socket.inet_ntoa(cdata[_EXT_ERR.size + 4:_EXT_ERR.size + 8])
            if ee is None or ee[1] != SO_EE_ORIGIN_ICMP:
                continue
            icmp_type, code = ee[2], ee[3]
            kind = "ttl" if icmp_type == 11 else ("unreach" if icmp_type == 3 else "icmp")
            msg = wire.parse(data, find=True)
            if msg is not None and msg.type == wire.TRACE:
                self._hop(msg.session, msg.seq, offender or UNKNOWN_ADDR, kind, code, nic, sock, addr[0] if addr else "")
            elif msg is not None and msg.type == wire.PROBE:
                p = self.sessions.get(msg.session)
                rec = p.recs.get(msg.seq) if p else None
                if rec is not None and not rec.final and icmp_type == 3:
                    rec.refused = True
            elif msg is None and icmp_type == 11:
                self._hop(None, None, offender or UNKNOWN_ADDR, kind, code, nic, sock, addr[0] if addr else "")

    def _hop(self, token, ttl, frm, kind, code, nic, sock, dst) -> None:
        sport = nic.sports.index(sock) if nic.sports and sock in nic.sports else -1
        self.out.append({"ev": "hop", "token": token, "ttl": ttl, "from": frm, "kind": kind, "code": code,
                         "nic": nic.index, "sport": sport, "dst": dst})
        self.stats["hops"] += 1

    def _answer(self, sock, nic: _Nic, msg, data: bytes, addr, rx: int) -> None:
        if msg.type not in (wire.PROBE, wire.TRACE) or len(data) < wire.ECHO_LEN:
            self.stats["bad_packets"] += 1
            return
        offset = self.offset if self.synced else 0
        seen = 0
        if msg.type == wire.PROBE:
            key = (addr[0], msg.session)
            flow = nic.flows.get(key)
            now = _now_mono()
            if flow is None and len(nic.flows) < 4096 and wire.name_ok(msg.name):
                flow = nic.flows[key] = _Flow(msg.name, now)
            if flow is not None:
                flow.last = now
                flow.update(msg.seq)
                seen = flow.before(msg.seq)
                if nic.next_emit and msg.window_ns < nic.next_emit:
                    nic.rx_late += 1
                else:
                    flow.rx[msg.window_ns] = flow.rx.get(msg.window_ns, 0) + 1
            self.stats["answered_probes"] += 1
        echo = wire.echo(wire.ECHO if msg.type == wire.PROBE else wire.TRACE_ECHO, msg.session, msg.seq,
                         rx + offset, _now_real() + offset, seen, self.synced, len(data))
        try:
            sock.sendto(echo, addr)
        except OSError:
            self.stats["send_errors"] += 1

    def _echo(self, msg, rx: int) -> None:
        p = self.sessions.get(msg.session)
        if p is None:
            self.stats["stale_echoes"] += 1
            return
        for i in range(MASK_BITS):
            q = p.recs.get((msg.seq - 1 - i) % 2**32)
            if q is not None and not q.final:
                q.known = True
                if msg.seen >> i & 1:
                    q.b_seen = True
        rec = p.recs.get(msg.seq)
        if rec is None or rec.final:
            self.stats["stale_echoes"] += 1
            return
        if rec.answered:
            return
        rec.known = rec.b_seen = rec.answered = True
        rec.rx_a, rec.rx_b, rec.tx_b, rec.b_synced = rx, msg.rx_ns, msg.tx_ns, msg.synced
        self.stats["echoes"] += 1

    # -- deadlines, finalizing, windows ---------------------------------------------------------
    def _tick(self, now: int) -> None:
        grace = self.cfg.grace_ns if self.cfg else 0
        for p in self.peers:
            while p.final_seq != p.next_seq:
                rec = p.recs.get(p.final_seq)
                if rec is not None and not rec.final:
                    if now < rec.tx_mono + rec.deadline_ns + grace:
                        break
                    self._finalize(p, rec)
                p.recs.pop((p.final_seq - 2 * MASK_BITS) % 2**32, None)
                p.final_seq = (p.final_seq + 1) % 2**32

    def _finalize(self, p: _Peer, r: _Rec) -> None:
        r.final = True
        a = self._acc(p, r.window_ns)
        if a is None:
            return

        def sport(which: int) -> None:
            a.sports.setdefault(r.sport, [0, 0, 0])[which] += 1

        if r.send_error:
            a.lost += 1
            a.send_errors += 1
            sport(0)
            return
        if r.answered:
            elapsed = r.rx_a - r.tx
            clock = r.a_synced and r.b_synced
            fwd = r.rx_b - (r.tx + r.a_offset)
            rev = (r.rx_a + r.a_offset) - r.tx_b
            rtt = elapsed - (r.tx_b - r.rx_b)  # the responder's turnaround is not the network's
            if rtt <= r.deadline_ns:
                a.answered += 1
                a.rsent += 1
                a.rtt.append(max(0, rtt))
                if clock:
                    a.clock_ok += 1
                    a.fwd.append(max(0, fwd))
                    a.rev.append(max(0, rev))
            elif clock and rev > fwd:
                a.rsent += 1
                a.rlost += 1
                a.rlate += 1
                sport(1)
            else:
                a.lost += 1
                a.late += 1
                sport(0)
            return
        if r.refused:
            a.lost += 1
            a.refused += 1
            sport(0)
        elif r.known and r.b_seen:
            a.rsent += 1
            a.rlost += 1
            sport(1)
        elif r.known:
            a.lost += 1
            sport(0)
        else:
            a.lost += 1
            a.unres += 1
            sport(2)

    def _emit_windows(self, wclock: int) -> None:
        cfg = self.cfg
        W = cfg.window_ns
        for nic in self.nics:
            if not nic.next_emit:
                nic.next_emit = wclock - wclock % W
                continue
            dmax = max((p.deadline_ns for p in self.peers if p.nic == nic.index), default=0)
            delay = dmax + cfg.grace_ns + cfg.margin_ns
            behind = (wclock - delay - nic.next_emit) // W
            if behind > SLOTS - 2:
                self.stats["windows_skipped"] += behind - 1
                nic.next_emit += (behind - 1) * W
            while wclock >= nic.next_emit + W + delay:
                self._emit(nic, nic.next_emit)
                nic.next_emit += W

    def _emit(self, nic: _Nic, w: int) -> None:
        cfg = self.cfg
        for p in self.peers:  # what is still open of this window is final now
            if p.nic != nic.index:
                continue
            while p.final_seq != p.next_seq:
                rec = p.recs.get(p.final_seq)
                if rec is not None and not rec.final:
                    if rec.window_ns > w:
                        break
                    self._finalize(p, rec)
                p.final_seq = (p.final_seq + 1) % 2**32
        peers = []
        for p in self.peers:
            if p.nic != nic.index:
                continue
            for old in [k for k in p.accs if k < w]:
                del p.accs[old]
            a = p.accs.pop(w, None)
            if a is None or not a.sent:
                continue
            clock = a.answered > 0 and a.clock_ok == a.answered
            entry = {"i": p.index, "seq0": a.seq0, "sent": a.sent, "lost": a.lost, "unres": a.unres, "late": a.late,
                     "refused": a.refused, "send_errors": a.send_errors, "rsent": a.rsent, "rlost": a.rlost,
                     "rlate": a.rlate, "answered": a.answered, "basis": "clock" if clock else "half_rtt", "hw": 0,
                     "deadline_ns": p.deadline_ns, "sport_step": p.sport_step, "sport_off": p.sport_off}
            if clock:
                entry["fwd"] = _pcts(a.fwd)
                entry["rev"] = _pcts(a.rev)
            entry["rtt"] = _pcts(a.rtt)
            if a.rtt:
                p99 = _rank(sorted(a.rtt), 0.99)
                p.deadline_ns = min(cfg.deadline_max_ns, max(cfg.deadline_floor_ns, p99 * cfg.deadline_k_milli // 1000))
            if a.sports:
                entry["sports"] = [[s, *c] for s, c in sorted(a.sports.items())]
            peers.append(entry)
        rx = []
        now = _now_mono()
        for key, flow in list(nic.flows.items()):
            for start in [k for k in flow.rx if k < w + cfg.window_ns]:
                n = flow.rx.pop(start)
                if start >= w:
                    rx.append([flow.name, start, n])
                else:
                    nic.rx_late += n
            if now - flow.last > 30_000_000_000:
                del nic.flows[key]
        self.out.append({"ev": "window", "nic": nic.index, "start_ns": w, "window_ns": cfg.window_ns,
                         "synced": int(self.synced), "peers": peers, "rx": rx, "rx_late": nic.rx_late,
                         "rx_stateless": 0})
        self.stats["windows"] += 1

    # -- path discovery ----------------------------------------------------------------------------
    def trace(self, token: int, peer: int, sport: int, ttl: int) -> None:
        if not 0 <= peer < len(self.peers) or not 1 <= ttl <= 64:
            return
        p = self.peers[peer]
        nic = self.nics[p.nic]
        if not nic.sports or not 0 <= sport < len(nic.sports):
            return
        data = wire.probe(wire.TRACE, token, ttl, 0, _now_real(), nic.name, False, self.cfg.payload)
        try:
            nic.sports[sport].sendmsg([data], [(socket.IPPROTO_IP, socket.IP_TTL, struct.pack("@i", ttl))],
                                      0, (p.addr, self.cfg.port))
            self.stats["traces"] += 1
        except OSError:
            pass

    def traces(self, probes: list[tuple[int, int, int, int]]) -> None:
        for t, p, s, ttl in probes:
            self.trace(t, p, s, ttl)

    def close(self) -> None:
        for n in self.nics:
            self._close_nic(n)
        self.nics = []
        self.sel.close()

    @property
    def pid(self) -> int:
        return os.getpid()


def _rank(values: list, q: float) -> int:
    k = max(1, math.ceil(q * len(values)))
    return values[k - 1]


def _pcts(values: list) -> list | None:
    if not values:
        return None
    values.sort()
    return [_rank(values, 0.5), _rank(values, 0.99), len(values)]
