"""Coded-probe prober and responder over UDP with kernel timestamps.

One :class:`ClockProber` per NIC: a UDP socket bound to the NIC's address (and, when named,
its interface, SO_BINDTODEVICE) with SO_TIMESTAMPING, software RX/TX timestamps always and the
NIC's raw hardware timestamps when the interface accepts SIOCSHWTSTAMP. Every kernel timestamp
goes through the :class:`~agent.clocksync.clock.ClockSource` (so a test's virtual clock
applies to packet timestamps exactly as to the agent's own readings).

With each peer, both ways: every ``1/rate`` s it sends a coded probe, two PROBE packets back to
back (``gap_ns`` is nominal; the estimator uses the measured send gap); the peer does the
same. Each side learns its own send stamps from the socket's error queue (OPT_ID numbers the
sends) and its receive stamps from the data path, and every ``report_s`` sends the peer a
REPORT with both (its send stamps for the peer's receives, its receive stamps for the peer's
sends). So each side holds the four timestamps of every packet in both directions and can
build a ``lockstep.clocktrace/v1`` for the pair (:meth:`ClockProber.trace`), with itself as A.

Wire format (network byte order), ``LSCK`` magic, version 1:

- PROBE  ``!4sBBBxQ`` magic, version, type 1, seq (0/1), probe id — padded to 64 bytes;
- REPORT ``!4sBBH`` magic, version, type 2, count, then count × ``!BBxxxxxxQq`` (kind 1 = my
  send stamp of my probe, 2 = my receive stamp of your probe; seq; probe id; ns on my clock).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import errno
import fcntl
import json
import os
import random
import select
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from agent.clocksync.clock import ClockSource
from agent.clocksync.trace import TRACE_FORMAT

SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SCM_TIMESTAMPING = SO_TIMESTAMPING
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
SIOCSHWTSTAMP = 0x89B0
TS_TX_HARDWARE, TS_TX_SOFTWARE, TS_RX_HARDWARE, TS_RX_SOFTWARE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
TS_SOFTWARE, TS_RAW_HARDWARE, TS_OPT_ID, TS_OPT_TSONLY = 1 << 4, 1 << 6, 1 << 7, 1 << 11
HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL = 1, 1

MAGIC, VERSION = b"LSCK", 1
T_PROBE, T_REPORT = 1, 2
PROBE_FMT = struct.Struct("!4sBBBxQ")
REPORT_HEAD = struct.Struct("!4sBBH")
REPORT_ENTRY = struct.Struct("!BBxxxxxxQq")
PROBE_SIZE = 64
MAX_REPORT_ENTRIES = 60
K_MY_SEND, K_MY_RECV = 1, 2


def _enable_hw_timestamps(sock: socket.socket, interface: str) -> bool:
    """Ask the NIC to timestamp every packet (SIOCSHWTSTAMP); False where it cannot (veth, most VMs)."""
    config = array.array("i", [0, HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL])
    address, _ = config.buffer_info()
    ifreq = struct.pack("16sP8x", interface.encode()[:15], address)
    try:
        fcntl.ioctl(sock.fileno(), SIOCSHWTSTAMP, ifreq)
    except OSError:
        return False
    return True


def open_socket(address: str, port: int, interface: str | None = None, hardware: bool = True):
    """A UDP socket with kernel timestamps; returns (socket, "hardware" | "software")."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if interface:
            sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, interface.encode())
        sock.bind((address, port))
        mode = "software"
        flags = TS_TX_SOFTWARE | TS_RX_SOFTWARE | TS_SOFTWARE | TS_OPT_ID | TS_OPT_TSONLY
        if hardware and interface and _enable_hw_timestamps(sock, interface):
            flags |= TS_TX_HARDWARE | TS_RX_HARDWARE | TS_RAW_HARDWARE
            mode = "hardware"
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock, mode


def _timestamp(ancdata) -> tuple[int | None, int | None]:
    """(software, raw hardware) ns from an SCM_TIMESTAMPING control message."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPING and len(data) >= 48:
            s0, n0, _, _, s2, n2 = struct.unpack("qqqqqq", data[:48])
            sw = s0 * 10**9 + n0 if (s0 or n0) else None
            hw = s2 * 10**9 + n2 if (s2 or n2) else None
            return sw, hw
    return None, None


def _ee_data(ancdata) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.IPPROTO_IP and kind == IP_RECVERR and len(data) >= 16:
            ee_errno, origin, _, _, _, _, ee_data = struct.unpack("IBBBBII", data[:16])
            if ee_errno == errno.ENOMSG:
                return ee_data
    return None


@dataclass
class _Peer:
    name: str
    address: tuple[str, int]
    next_probe_ns: int = 0
    next_id: int = 0
    mine: dict = field(default_factory=dict)  # (id, seq) -> [tx, rx]: my probes to the peer
    theirs: dict = field(default_factory=dict)  # (id, seq) -> [tx, rx]: the peer's probes to me
    pending: list = field(default_factory=list)  # report entries not yet sent
    order: deque = field(default_factory=deque)  # (local ns, "mine"|"theirs", key): for pruning


@dataclass
class ProberStats:
    sent: int = 0
    received: int = 0
    reports_sent: int = 0
    reports_received: int = 0
    tx_stamps: int = 0
    missing_tx_stamps: int = 0
    bad_packets: int = 0
    cpu_s: float = 0.0


class ClockProber:
    """Probes peers and answers their probes on one socket, in one thread.

    ``peers``: ``{name: (address, port)}``; replace them with :meth:`set_peers` (a re-plan).
    """

    def __init__(self, name: str, address: str, port: int, peers: dict[str, tuple[str, int]] | None = None,
                 interface: str | None = None, source: ClockSource | None = None, rate_hz: float = 200.0,
                 gap_ns: int = 20000, report_s: float = 0.05, keep_s: float = 10.0, hardware: bool = True):
        self.name = name
        self.source = source or ClockSource.from_env()
        self.sock, self.mode = open_socket(address, port, interface, hardware)
        self.rate_hz, self.gap_ns = float(rate_hz), int(gap_ns)
        self.report_ns = int(report_s * 1e9)
        self.keep_ns = int(keep_s * 1e9)
        self.stats = ProberStats()
        self._peers: dict[str, _Peer] = {}
        self._by_addr: dict[tuple[str, int], _Peer] = {}
        self._sends: dict[int, tuple[_Peer, tuple[int, int]] | None] = {}  # OPT_ID -> packet
        self._send_counter = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rng = random.Random(hash((name, address, port)))
        self.set_peers(peers or {})

    # --- control ---------------------------------------------------------------------------

    def set_peers(self, peers: dict[str, tuple[str, int]]) -> None:
        with self._lock:
            keep = {n: p for n, p in self._peers.items() if n in peers and p.address == tuple(peers[n])}
            for n, addr in peers.items():
                if n not in keep:
                    keep[n] = _Peer(n, (addr[0], int(addr[1])))
            self._peers = keep
            self._by_addr = {p.address: p for p in keep.values()}

    def start(self) -> ClockProber:
        self._thread = threading.Thread(target=self._run, name=f"clockprober-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.sock.close()

    def __enter__(self) -> ClockProber:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        cpu0 = time.thread_time()
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN | select.POLLERR)
        next_report = time.monotonic_ns() + self.report_ns
        try:
            while not self._stop.is_set():
                now = time.monotonic_ns()
                with self._lock:
                    peers = list(self._peers.values())
                due = min([p.next_probe_ns for p in peers] + [next_report, now + 100_000_000])
                timeout_ms = max(0.0, (due - now) / 1e6)
                for _, event in poller.poll(timeout_ms):
                    if event & select.POLLERR:
                        self._drain_errqueue()
                    if event & select.POLLIN:
                        self._drain_data()
                now = time.monotonic_ns()
                for peer in peers:
                    if peer.next_probe_ns <= now:
                        self._send_probe(peer)
                        period = 1e9 / self.rate_hz
                        peer.next_probe_ns = now + int(period * self._rng.uniform(0.5, 1.5))
                if now >= next_report:
                    for peer in peers:
                        self._send_report(peer)
                        self._prune(peer)
                    next_report = now + self.report_ns
                self.stats.cpu_s = time.thread_time() - cpu0
        except OSError:
            if not self._stop.is_set():
                raise

    def _sendto(self, data: bytes, peer: _Peer, key: tuple[int, int] | None) -> None:
        try:
            self.sock.sendto(data, peer.address)
        except (BlockingIOError, OSError):
            return  # no counter consumed only when the kernel refused the send
        self._sends[self._send_counter] = (peer, key) if key is not None else None
        self._send_counter = (self._send_counter + 1) & 0xFFFFFFFF
        if len(self._sends) > 100_000:  # stamps that never came
            for k in list(self._sends)[:50_000]:
                if self._sends.pop(k) is not None:
                    self.stats.missing_tx_stamps += 1

    def _send_probe(self, peer: _Peer) -> None:
        pid = peer.next_id
        peer.next_id += 1
        for seq in (0, 1):
            key = (pid, seq)
            peer.mine[key] = [None, None]
            peer.order.append((self.source.now_ns(), "mine", key))
            self._sendto(PROBE_FMT.pack(MAGIC, VERSION, T_PROBE, seq, pid).ljust(PROBE_SIZE, b"\0"), peer, key)
            self.stats.sent += 1

    def _send_report(self, peer: _Peer) -> None:
        while peer.pending:
            chunk, peer.pending = peer.pending[:MAX_REPORT_ENTRIES], peer.pending[MAX_REPORT_ENTRIES:]
            body = b"".join(REPORT_ENTRY.pack(*e) for e in chunk)
            self._sendto(REPORT_HEAD.pack(MAGIC, VERSION, T_REPORT, len(chunk)) + body, peer, None)
            self.stats.reports_sent += 1

    def _prune(self, peer: _Peer) -> None:
        horizon = self.source.now_ns() - self.keep_ns
        while peer.order and peer.order[0][0] < horizon:
            _, which, key = peer.order.popleft()
            (peer.mine if which == "mine" else peer.theirs).pop(key, None)

    def _stamp(self, ancdata) -> int | None:
        # One clock domain per socket: in hardware mode a packet without a NIC stamp is dropped
        # rather than mixed in with a system-clock stamp.
        sw, hw = _timestamp(ancdata)
        raw = hw if self.mode == "hardware" else sw
        return None if raw is None else self.source.transform(raw)

    def _drain_errqueue(self) -> None:
        while True:
            try:
                _, ancdata, _, _ = self.sock.recvmsg(1, 512, MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                return
            counter = _ee_data(ancdata)
            stamp = self._stamp(ancdata)
            if counter is None or stamp is None:
                continue
            entry = self._sends.pop(counter, None)
            if entry is None:
                continue
            peer, key = entry
            rec = peer.mine.get(key)
            if rec is not None:
                rec[0] = stamp
                peer.pending.append((K_MY_SEND, key[1], key[0], stamp))
                self.stats.tx_stamps += 1

    def _drain_data(self) -> None:
        while True:
            try:
                data, ancdata, _, addr = self.sock.recvmsg(2048, 512)
            except (BlockingIOError, InterruptedError):
                return
            stamp = self._stamp(ancdata)
            with self._lock:
                peer = self._by_addr.get((addr[0], addr[1]))
            if peer is None or len(data) < 8 or data[:4] != MAGIC or data[4] != VERSION:
                self.stats.bad_packets += 1
                continue
            if data[5] == T_PROBE and len(data) >= PROBE_FMT.size and stamp is not None:
                _, _, _, seq, pid = PROBE_FMT.unpack_from(data)
                key = (pid, seq)
                rec = peer.theirs.setdefault(key, [None, None])
                if rec[1] is None:
                    peer.order.append((stamp, "theirs", key))
                rec[1] = stamp
                peer.pending.append((K_MY_RECV, seq, pid, stamp))
                self.stats.received += 1
            elif data[5] == T_REPORT:
                self._on_report(peer, data)
            else:
                self.stats.bad_packets += 1

    def _on_report(self, peer: _Peer, data: bytes) -> None:
        _, _, _, count = REPORT_HEAD.unpack_from(data)
        if len(data) < REPORT_HEAD.size + count * REPORT_ENTRY.size:
            self.stats.bad_packets += 1
            return
        self.stats.reports_received += 1
        for k in range(count):
            kind, seq, pid, ts = REPORT_ENTRY.unpack_from(data, REPORT_HEAD.size + k * REPORT_ENTRY.size)
            if kind == K_MY_SEND:  # the peer's send stamp of its probe to me
                rec = peer.theirs.get((pid, seq))
                if rec is None:
                    rec = peer.theirs[(pid, seq)] = [None, None]
                    peer.order.append((self.source.now_ns(), "theirs", (pid, seq)))
                rec[0] = ts
            elif kind == K_MY_RECV:  # the peer's receive stamp of my probe
                rec = peer.mine.get((pid, seq))
                if rec is not None:
                    rec[1] = ts

    # --- results -----------------------------------------------------------------------------

    def peers(self) -> list[str]:
        with self._lock:
            return sorted(self._peers)

    def trace(self, peer_name: str, window_s: float = 2.0, t_ref_ns: int | None = None) -> dict:
        """The last ``window_s`` of complete packets with ``peer_name`` as a lockstep.clocktrace/v1 (A = me)."""
        with self._lock:
            peer = self._peers[peer_name]
        t_ref = self.source.now_ns() if t_ref_ns is None else int(t_ref_ns)
        lo = t_ref - int(window_s * 1e9)
        probes = []
        for (pid, seq), (tx, rx) in list(peer.mine.items()):
            if tx is not None and rx is not None and lo <= tx <= t_ref:
                probes.append((tx, {"dir": "ab", "id": 2 * pid, "seq": seq, "tx": tx, "rx": rx}))
        for (pid, seq), (tx, rx) in list(peer.theirs.items()):
            if tx is not None and rx is not None and lo <= rx <= t_ref:
                probes.append((rx, {"dir": "ba", "id": 2 * pid + 1, "seq": seq, "tx": tx, "rx": rx}))
        probes.sort(key=lambda p: p[0])
        return {"format": TRACE_FORMAT, "a": self.name, "b": peer_name, "gap_ns": self.gap_ns,
                "t_ref_ns": t_ref, "probes": [p for _, p in probes], "timestamping": self.mode}


def interface_of(address: str) -> str | None:
    """The interface that holds ``address`` in this network namespace (for SO_BINDTODEVICE)."""
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True,
                             timeout=5, env={**os.environ, "LC_ALL": "C"}).stdout
        for link in json.loads(out):
            for info in link.get("addr_info", []):
                if info.get("local") == address:
                    return link.get("ifname")
    return None


def main(argv: list[str] | None = None) -> int:
    """Run a prober for a while and write its traces: the namespace tests' and benchmarks' tool.

    ``python -m agent.clocksync.probe --name A --bind ADDR [--interface IF] --peer B=ADDR:PORT ...
    --duration S --out DIR`` writes ``DIR/<A>~<B>.json`` (the last window) for every peer, and
    ``DIR/<A>.stats.json``; with ``--every S`` it rewrites those traces every S seconds (atomically).
    """
    parser = argparse.ArgumentParser(prog="python -m agent.clocksync.probe")
    parser.add_argument("--name", required=True)
    parser.add_argument("--bind", required=True, help="the NIC address to bind")
    parser.add_argument("--port", type=int, default=31900)
    parser.add_argument("--interface", help="bind to this interface (default: the one holding --bind)")
    parser.add_argument("--peer", action="append", default=[], help="NAME=ADDR[:PORT]")
    parser.add_argument("--rate", type=float, default=200.0, help="coded probes per second per peer")
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    peers = {}
    for spec in args.peer:
        name, _, hostport = spec.partition("=")
        host, _, port = hostport.partition(":")
        peers[name] = (host, int(port or args.port))
    os.makedirs(args.out, exist_ok=True)
    interface = args.interface or interface_of(args.bind)
    prober = ClockProber(args.name, args.bind, args.port, peers, interface=interface, rate_hz=args.rate)
    start = time.monotonic()
    written = 0

    def dump(suffix: str) -> None:
        for peer in prober.peers():
            doc = prober.trace(peer, args.window)
            path = os.path.join(args.out, f"{args.name}~{peer}{suffix}.json")
            with open(path + ".tmp", "w") as fh:
                json.dump(doc, fh)
            os.replace(path + ".tmp", path)

    with prober:
        while (elapsed := time.monotonic() - start) < args.duration:
            if args.every and elapsed >= (written + 1) * args.every:
                written += 1
                dump("")
            time.sleep(0.01)
        dump("")
    with open(os.path.join(args.out, f"{args.name}.stats.json"), "w") as fh:
        json.dump({"mode": prober.mode, "interface": interface, "process_cpu_s": time.process_time(),
                   "wall_s": time.monotonic() - start, **prober.stats.__dict__}, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
