"""The load generator: timed UDP (or TCP) flows bound to the NICs, measured at both ends.

One run on one agent sends the flows of the traffic plan that leave its NICs and receives the
flows that arrive at them, all agents starting at the same ``start_at`` so every link is loaded
at once. UDP flows are paced at ``rate_mbit`` each; every datagram carries a header::

    magic "LSL1" | run (u32) | flow id (u32) | sequence (u32) | send time (i64 ns)

``start_at`` is an instant of *cluster time*: an agent whose clock sync is synchronized starts at
that instant by its cluster clock, and stamps send times in cluster time (one-way delays are then
measured against the cluster clock). An agent without a synchronized clock says so in its result
(``clock.basis: "realtime"`` and its ``reason``) and starts by its own CLOCK_REALTIME, which
is exact within one machine, as in the emulated testbed, and NTP-close elsewhere. The receiver
takes the kernel's receive timestamp (``SO_TIMESTAMPNS``) of each datagram. Both sides count by
*window of the send time* (``floor((t_send - start_at) / window_s)``), so a window's sent and
received counts describe the same packets; the console merges them into
``lockstep.observations/v1`` windows (``workers.trafficplan.windows``).

A datagram the sending host's own netfilter drops (``sendto`` fails with ``EPERM``) counts as
sent and lost (``local_drops``): it left the application and never reached the wire. Other send
errors (no route, no buffer) count as not sent (``send_errors``).

A sender that falls behind its schedule by more than ``MAX_LAG_S`` (a busy host) skips the
missed slots instead of bursting them, and reports how many it skipped: what was sent is what
was offered, so a busy sender never shows up as loss on the network.

Before the load, while it waits for ``start_at`` (``trace_ttl`` > 0 and at least ``TRACE_MIN_S``
left), each UDP flow's own 5-tuple is sent once with that TTL from a socket bound to the flow's
source (Paris-traceroute style: ECMP hashes it onto the flow's path), and ``trace_extra`` more
tuples from kernel-chosen source ports to the same destination; the switch where it expires
answers ICMP time exceeded from the address of the port it arrived on, read from the socket's
error queue (``IP_RECVERR``, no raw socket). ``paths`` lists each trace's answering address: with
TTL 2, the switch after the first one, i.e. the uplink a flow left its leaf by (the console's
ECMP check, ``workers.audit.ecmp``).

TCP flows (``protocol: "tcp"``) measure goodput only: bytes received per window of receive time.

Run it outside the agent with ``python -m agent.audit.loadgen SPEC.json`` (the command's
arguments as a JSON file); the result is printed as JSON.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import json
import math
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

FORMAT = "lockstep.audit.load/v1"
MAGIC = b"LSL1"
HEADER = struct.Struct("!4sIIIq")
MAX_LAG_S = 0.02
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
RCVBUF = 8 << 20
_TIMESPEC = struct.Struct("@qq")
IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_EXT_ERR = struct.Struct("=IBBBBII")  # struct sock_extended_err; the offender's sockaddr follows
SO_EE_ORIGIN_ICMP = 2
TRACE_MIN_S = 0.5  # the least time before start_at worth tracing in
TRACE_MAGIC = b"LSLT"


class LoadError(ValueError):
    """The load spec is not usable; the message names the field."""


def _check(spec: dict) -> None:
    for key, typ in (("run", int), ("start_at", (int, float)), ("duration_s", (int, float)), ("window_s", (int, float))):
        if not isinstance(spec.get(key), typ) or isinstance(spec.get(key), bool):
            raise LoadError(f"{key} is required and must be a number")
    if spec["duration_s"] <= 0 or spec["window_s"] <= 0:
        raise LoadError("duration_s and window_s must be positive")
    if spec.get("protocol", "udp") not in ("udp", "tcp"):
        raise LoadError(f"protocol {spec.get('protocol')!r}: use 'udp' or 'tcp'")
    size = spec.get("packet_bytes", 1400)
    if not isinstance(size, int) or not HEADER.size <= size <= 65000:
        raise LoadError(f"packet_bytes {size!r}: between {HEADER.size} and 65000")
    ids = set()
    for i, f in enumerate(spec.get("flows", [])):
        for key in ("id", "src", "src_addr", "dst", "dst_addr", "sport", "dport", "rate_mbit"):
            if key not in f:
                raise LoadError(f"flows[{i}].{key} is required")
        if f["id"] in ids:
            raise LoadError(f"flows[{i}].id {f['id']} is used twice")
        ids.add(f["id"])
        if not (isinstance(f["rate_mbit"], (int, float)) and f["rate_mbit"] >= 0):
            raise LoadError(f"flows[{i}].rate_mbit must be a number >= 0")
        if spec.get("protocol", "udp") == "udp" and f["rate_mbit"] <= 0:
            raise LoadError(f"flows[{i}].rate_mbit must be positive for UDP flows")
    for i, lis in enumerate(spec.get("listen", [])):
        for key in ("nic", "addr", "port", "flows"):
            if key not in lis:
                raise LoadError(f"listen[{i}].{key} is required")


def _bind_device(sock: socket.socket, device: str | None, errors: list[str]) -> None:
    if not device:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, device.encode())
    except OSError as exc:  # without CAP_NET_RAW the source address still selects the NIC's routes
        errors.append(f"SO_BINDTODEVICE {device}: {exc.strerror}; bound by address only")


def _rcvbuf(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)


def _percentiles(values: list[float]) -> dict | None:
    if not values:
        return None
    values.sort()
    n = len(values)

    def q(p: float) -> float:
        return round(values[min(n - 1, int(math.ceil(p * n)) - 1)], 2)

    return {"p50": q(0.5), "p99": q(0.99), "max": round(values[-1], 2)}


class _Window:
    def __init__(self, start_ns: int, window_ns: int, windows: int):
        self.start_ns, self.window_ns, self.windows = start_ns, window_ns, windows

    def of(self, t_ns: int) -> int:
        return (t_ns - self.start_ns) // self.window_ns


# -- UDP -------------------------------------------------------------------------------------------


def _udp_receiver(spec: dict, win: _Window, offset_ns: int, stop_at: float, ready: threading.Event,
                  out: dict, errors: list[str]) -> None:
    sel = selectors.DefaultSelector()
    owner: dict[int, dict] = {}  # flow id -> its pair entry
    entries: list[dict] = []
    socks = []
    try:
        for lis in spec.get("listen", []):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            _rcvbuf(sock)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            _bind_device(sock, lis.get("device"), errors)
            sock.bind((lis["addr"], int(lis["port"])))
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
            pairs: dict[str, dict] = {}
            for f in lis["flows"]:
                entry = pairs.get(f["src"])
                if entry is None:
                    entry = pairs[f["src"]] = {"nic": lis["nic"], "src": f["src"], "received": [0] * win.windows,
                                               "bytes": [0] * win.windows, "_owd": [[] for _ in range(win.windows)],
                                               "flows": {}, "duplicates": 0, "late": 0, "_seen": {}}
                    entries.append(entry)
                entry["flows"][str(f["id"])] = 0
                entry["_seen"][f["id"]] = set()
                owner[f["id"]] = entry
    except OSError as exc:
        errors.append(f"receiver: {exc}")
        ready.set()
        for s in socks:
            s.close()
        out["rx"], out["unexpected"] = [], 0
        return
    ready.set()
    run = int(spec["run"])
    unexpected = 0
    anc = socket.CMSG_SPACE(_TIMESPEC.size)
    try:
        while True:
            remaining = stop_at - time.time()
            if remaining <= 0:
                break
            for key, _ in sel.select(min(remaining, 0.2)):
                sock = key.fileobj
                while True:
                    try:
                        data, ancdata, _flags, _addr = sock.recvmsg(65536, anc)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno in (errno.EINTR, errno.ECONNREFUSED):
                            continue
                        raise
                    t_rx = None
                    for level, ctype, cdata in ancdata:
                        if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS and len(cdata) >= _TIMESPEC.size:
                            sec, nsec = _TIMESPEC.unpack_from(cdata)
                            t_rx = sec * 1_000_000_000 + nsec
                    if t_rx is None:
                        t_rx = time.time_ns()
                    if len(data) < HEADER.size:
                        unexpected += 1
                        continue
                    magic, prun, flow, seq, t_tx = HEADER.unpack_from(data)
                    entry = owner.get(flow)
                    if magic != MAGIC or prun != run or entry is None:
                        unexpected += 1
                        continue
                    seen = entry["_seen"][flow]
                    if seq in seen:
                        entry["duplicates"] += 1
                        continue
                    seen.add(seq)
                    w = win.of(t_tx)
                    if not 0 <= w < win.windows:
                        entry["late"] += 1
                        continue
                    entry["received"][w] += 1
                    entry["bytes"][w] += len(data)
                    entry["flows"][str(flow)] += 1
                    entry["_owd"][w].append((t_rx + offset_ns - t_tx) / 1000.0)
    finally:
        for s in socks:
            sel.unregister(s)
            s.close()
    for entry in entries:
        entry["owd_us"] = [_percentiles(v) for v in entry.pop("_owd")]
        entry.pop("_seen")
    out["rx"], out["unexpected"] = entries, unexpected


def _udp_sender(spec: dict, win: _Window, offset_ns: int, end: float, cancelled: threading.Event,
                out: dict, errors: list[str]) -> None:
    flows = spec.get("flows", [])
    size = int(spec.get("packet_bytes", 1400))
    pad = b"\0" * (size - HEADER.size)
    run = int(spec["run"])
    tx, socks, heap = [], [], []
    start = win.start_ns / 1e9 - offset_ns / 1e9  # on this host's clock
    for i, f in enumerate(flows):
        entry = {"flow": f["id"], "src": f["src"], "dst": f["dst"], "sport": f["sport"], "sent": [0] * win.windows,
                 "bytes": [0] * win.windows, "skipped": 0, "send_errors": 0, "local_drops": 0, "lag_max_ms": 0.0}
        tx.append(entry)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            _bind_device(sock, f.get("device"), errors)
            sock.bind((f["src_addr"], int(f["sport"])))
        except OSError as exc:
            errors.append(f"flow {f['id']}: cannot bind {f['src_addr']}:{f['sport']}: {exc}")
            sock.close()
            socks.append(None)
            continue
        socks.append(sock)
        interval = size * 8 / (float(f["rate_mbit"]) * 1e6)
        # stagger the flows inside one interval so the NIC's packets are spread, not bunched
        heapq.heappush(heap, (start + interval * i / max(1, len(flows)), i, interval, 0))
    out["tx"] = tx
    try:
        while heap and not cancelled.is_set():
            due, i, interval, seq = heap[0]
            if due >= end:
                heapq.heappop(heap)
                continue
            now = time.time()
            if due > now:
                time.sleep(min(due - now, 0.002))
                continue
            lag = now - due
            entry = tx[i]
            if lag > MAX_LAG_S:  # skip the missed slots: offer what the schedule still allows
                missed = int(lag / interval)
                entry["skipped"] += missed
                entry["lag_max_ms"] = max(entry["lag_max_ms"], round(lag * 1000, 3))
                heapq.heapreplace(heap, (due + missed * interval, i, interval, seq + missed))
                continue
            t_tx = time.time_ns() + offset_ns
            w = win.of(t_tx)
            f = flows[i]
            try:
                socks[i].sendto(HEADER.pack(MAGIC, run, f["id"], seq & 0xFFFFFFFF, t_tx) + pad,
                                (f["dst_addr"], int(f["dport"])))
                if 0 <= w < win.windows:
                    entry["sent"][w] += 1
                    entry["bytes"][w] += size
            except PermissionError:
                # this host's own netfilter dropped it on the way out (EPERM): it left the
                # application and never reached the wire, which is loss on this NIC's path
                entry["local_drops"] += 1
                if 0 <= w < win.windows:
                    entry["sent"][w] += 1
                    entry["bytes"][w] += size
            except OSError:
                entry["send_errors"] += 1  # not sent (no route, no buffer), so not counted as sent
            heapq.heapreplace(heap, (due + interval, i, interval, seq + 1))
    finally:
        for s in socks:
            if s is not None:
                s.close()


# -- path trace ------------------------------------------------------------------------------------


def _icmp_answer(sock: socket.socket) -> tuple[str | None, str] | None:
    """(offender address, "ttl" | "unreach" | "icmp") of one queued ICMP error, None when none is queued."""
    try:
        _data, anc, _flags, _addr = sock.recvmsg(512, 512, MSG_ERRQUEUE)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return None
    for level, ctype, cdata in anc:
        if level == socket.IPPROTO_IP and ctype == IP_RECVERR and len(cdata) >= _EXT_ERR.size:
            ee = _EXT_ERR.unpack_from(cdata)
            if ee[1] != SO_EE_ORIGIN_ICMP:
                return None, "other"
            offender = None
            if len(cdata) >= _EXT_ERR.size + 8 and struct.unpack_from("=H", cdata, _EXT_ERR.size)[0] == socket.AF_INET:
                offender = socket.inet_ntoa(cdata[_EXT_ERR.size + 4:_EXT_ERR.size + 8])
            return offender, "ttl" if ee[2] == 11 else "unreach" if ee[2] == 3 else "icmp"
    return None, "other"


def _trace(flows: list[dict], run: int, ttl: int, extra: int, deadline: float, errors: list[str]) -> list[dict]:
    """Each flow's answering address at `ttl`, from its own source port and from `extra` more
    (kernel-chosen) ones to the same destination (see the module docstring); until `deadline`."""
    socks: dict[socket.socket, dict] = {}
    sel = selectors.DefaultSelector()
    try:
        for f in flows:
            for j in range(1 + extra):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                try:
                    _bind_device(sock, f.get("device"), [])
                    sock.bind((f["src_addr"], int(f["sport"]) if j == 0 else 0))
                    sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
                    sock.setblocking(False)
                    sock.sendto(TRACE_MAGIC + struct.pack("!II", run, f["id"]), (f["dst_addr"], int(f["dport"])))
                except OSError as exc:
                    errors.append(f"trace of flow {f['id']}: {exc}")
                    sock.close()
                    continue
                socks[sock] = {"flow": f["id"], "sport": sock.getsockname()[1], "ttl": ttl, "hop": None, "answer": None}
                sel.register(sock, selectors.EVENT_READ)
        waiting = set(socks)
        while waiting and time.time() < deadline:
            # a queued ICMP error makes the socket readable (POLLERR)
            for key, _ in sel.select(min(0.05, max(0.0, deadline - time.time()))):
                answer = _icmp_answer(key.fileobj)
                if answer is not None and key.fileobj in waiting:
                    socks[key.fileobj]["hop"], socks[key.fileobj]["answer"] = answer
                    waiting.discard(key.fileobj)
                    sel.unregister(key.fileobj)
    finally:
        for sock in socks:
            sock.close()
        sel.close()
    return list(socks.values())


# -- TCP -------------------------------------------------------------------------------------------


def _tcp_receiver(spec: dict, win: _Window, offset_ns: int, stop_at: float, ready: threading.Event, out: dict,
                  errors: list[str]) -> None:
    entries: dict[int, dict] = {}
    servers = []
    lock = threading.Lock()
    for lis in spec.get("listen", []):
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            _bind_device(srv, lis.get("device"), errors)
            srv.bind((lis["addr"], int(lis["port"])))
            srv.listen(64)
        except OSError as exc:
            errors.append(f"receiver {lis['addr']}:{lis['port']}: {exc}")
            srv.close()
            continue
        srv.settimeout(0.2)
        servers.append((srv, lis))
        for f in lis["flows"]:
            entries[f["id"]] = {"nic": lis["nic"], "src": f["src"], "flow": f["id"], "bytes": [0] * win.windows}
    ready.set()
    run = int(spec["run"])
    threads = []

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(max(0.1, stop_at - time.time()))
            try:
                head = b""
                while len(head) < HEADER.size:
                    chunk = conn.recv(HEADER.size - len(head))
                    if not chunk:
                        return
                    head += chunk
                magic, prun, flow, _seq, _t = HEADER.unpack(head)
                entry = entries.get(flow)
                if magic != MAGIC or prun != run or entry is None:
                    return
                while True:
                    data = conn.recv(1 << 18)
                    if not data:
                        return
                    w = win.of(time.time_ns() + offset_ns)
                    if 0 <= w < win.windows:
                        with lock:
                            entry["bytes"][w] += len(data)
            except OSError:
                return

    while time.time() < stop_at:
        for srv, _lis in servers:
            try:
                conn, _ = srv.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError as exc:
                errors.append(f"receiver accept: {exc}")
                continue
            t = threading.Thread(target=serve, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
        if not servers:
            time.sleep(0.1)
    for srv, _ in servers:
        srv.close()
    for t in threads:
        t.join(timeout=1.0)
    out["rx"] = list(entries.values())
    out["unexpected"] = 0


def _tcp_sender(spec: dict, win: _Window, offset_ns: int, end: float, cancelled: threading.Event, out: dict,
                errors: list[str]) -> None:
    run = int(spec["run"])
    tx = []
    threads = []
    chunk = b"\xa5" * (1 << 16)

    def send(f: dict, entry: dict) -> None:
        try:
            sock = socket.create_connection((f["dst_addr"], int(f["dport"])), timeout=5,
                                            source_address=(f["src_addr"], int(f["sport"])))
        except OSError as exc:
            errors.append(f"flow {f['id']}: connect {f['dst_addr']}:{f['dport']}: {exc}")
            return
        rate = float(f["rate_mbit"]) * 1e6 / 8  # bytes/s; 0 = as fast as possible
        with sock:
            try:
                sock.sendall(HEADER.pack(MAGIC, run, f["id"], 0, time.time_ns()))
                sent_total, t0 = 0, time.time()
                while not cancelled.is_set():
                    now = time.time()
                    if now >= end:
                        break
                    if rate and sent_total > rate * (now - t0):
                        time.sleep(min(0.005, end - now))
                        continue
                    n = sock.send(chunk)
                    sent_total += n
                    w = win.of(time.time_ns() + offset_ns)
                    if 0 <= w < win.windows:
                        entry["bytes"][w] += n
                sock.shutdown(socket.SHUT_WR)
            except OSError as exc:
                errors.append(f"flow {f['id']}: {exc}")

    start = win.start_ns / 1e9 - offset_ns / 1e9  # on this host's clock
    while time.time() < start and not cancelled.is_set():
        time.sleep(min(0.01, start - time.time()))
    for f in spec.get("flows", []):
        entry = {"flow": f["id"], "src": f["src"], "dst": f["dst"], "sport": f["sport"], "bytes": [0] * win.windows}
        tx.append(entry)
        t = threading.Thread(target=send, args=(f, entry), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=max(1.0, end - time.time() + 10))
    out["tx"] = tx


# -- a run -----------------------------------------------------------------------------------------


def _cluster_offset_ns(clock: Callable[[], dict | None] | None) -> tuple[int, str | None]:
    """(cluster time minus CLOCK_REALTIME, None) from a synchronized clock service; else
    (0, why this agent cannot start by cluster time)."""
    if clock is None:
        return 0, "no cluster clock on this agent"
    try:
        reading = clock()
    except Exception as exc:  # noqa: BLE001 - a broken clock service: start in realtime, say so
        return 0, f"the clock service failed ({exc})"
    if not reading:
        return 0, "no clock sync runs on this node"
    if not reading.get("synced"):
        return 0, "this node's clock sync is not synchronized"
    # from the reading itself, not its offset field: one subtraction, no sign convention to trust
    return int(reading["cluster_time_ns"]) - time.time_ns(), None


def run_load(spec: dict, *, cancelled: threading.Event | None = None,
             clock: Callable[[], dict | None] | None = None, now: Callable[[], float] = time.time) -> dict:
    """Run the flows and listeners of ``spec`` (the ``audit.load`` arguments); returns the result.

    ``clock``: the agent's cluster-time reading (``{"synced", "cluster_time_ns", ...}`` or None)."""
    _check(spec)
    cancelled = cancelled or threading.Event()
    errors: list[str] = []
    offset_ns, unsynced = _cluster_offset_ns(clock)
    start_at = float(spec["start_at"])  # cluster time
    duration = float(spec["duration_s"])
    window_s = float(spec["window_s"])
    windows = max(1, int(math.ceil(duration / window_s - 1e-9)))
    grace = float(spec.get("grace_s", 1.0))
    # windows are of the send stamp (cluster time); the schedule runs on this host's clock
    win = _Window(int(start_at * 1e9), int(window_s * 1e9), windows)
    local_start = start_at - offset_ns / 1e9
    late = max(0.0, now() - local_start)
    end = local_start + duration
    out: dict[str, Any] = {}
    ready = threading.Event()
    protocol = spec.get("protocol", "udp")
    ttl = int(spec.get("trace_ttl", 0))
    paths = None
    if ttl and protocol == "udp" and spec.get("flows"):
        if local_start - now() >= TRACE_MIN_S:  # trace while waiting, never into the load
            paths = _trace(spec["flows"], int(spec["run"]), ttl, int(spec.get("trace_extra", 0)), local_start - 0.2,
                           errors)
        else:
            errors.append(f"no time to trace the flows' paths before start_at (under {TRACE_MIN_S} s left)")
    if protocol == "udp":
        receiver = threading.Thread(target=_udp_receiver, args=(spec, win, offset_ns, end + grace, ready, out, errors),
                                    name="load-rx", daemon=True)
    else:
        receiver = threading.Thread(target=_tcp_receiver, args=(spec, win, offset_ns, end + grace, ready, out, errors),
                                    name="load-rx", daemon=True)
    receiver.start()
    ready.wait(10)
    if protocol == "udp":
        _udp_sender(spec, win, offset_ns, end, cancelled, out, errors)
    else:
        _tcp_sender(spec, win, offset_ns, end, cancelled, out, errors)
    receiver.join(timeout=max(0.0, end + grace - time.time()) + 10)
    return {
        "format": FORMAT, "run": int(spec["run"]), "protocol": protocol, "start_at": start_at, "duration_s": duration,
        "window_s": window_s, "windows": windows, "packet_bytes": int(spec.get("packet_bytes", 1400)),
        "started_late_s": round(late, 6), "clock": {"basis": "realtime" if unsynced else "lockstep", "offset_ns": offset_ns}
        | ({"reason": unsynced + ": started at start_at by its own clock"} if unsynced else {}),
        "tx": out.get("tx", []), "rx": out.get("rx", []), "unexpected": out.get("unexpected", 0),
        "cancelled": cancelled.is_set(), "errors": errors,
    } | ({"paths": paths} if paths is not None else {})


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m agent.audit.loadgen SPEC.json   (the audit.load arguments)", file=sys.stderr)
        return 2
    try:
        with open(args[0], encoding="utf-8") as fh:
            spec = json.load(fh)
        result = run_load(spec)
    except (OSError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
