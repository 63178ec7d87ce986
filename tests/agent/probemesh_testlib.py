"""Helpers for the probe-mesh tests: a runner in a thread, loopback plans, a scriptable responder."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Callable

from agent.clusterclock import ClusterTime
from agent.commands.registry import validate_args
from agent.probemesh import plan as planmod
from agent.probemesh import wire
from agent.probemesh.runner import MeshRunner


def loopback_base() -> str:
    """A private 127.a.b.0/24 for one test (other engineers' tests use 127.0.0.x)."""
    return f"127.{random.randrange(100, 250)}.{random.randrange(1, 250)}"


def free_udp_port(addr: str = "127.0.0.1") -> int:
    for _ in range(100):
        port = random.randrange(20000, 30000)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.bind((addr, port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free UDP port")


def checked(doc: dict) -> dict:
    return planmod.check(validate_args(planmod.ARGS, doc))


class SyncedClock:
    """Every host of a test shares this machine's clock: synchronized, offset 0."""

    def now(self) -> ClusterTime:
        return ClusterTime(time.time_ns(), 0, 0.0, 0, True)


class RunnerThread:
    def __init__(self, plan: dict, clock=None):
        self.records: list[tuple[float, dict]] = []
        self.runner = MeshRunner(self._emit, clock)
        self.runner.apply(checked(plan))
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._replan: dict | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _emit(self, kind: str, data: dict) -> None:
        assert kind == "probe.window"
        with self._lock:
            self.records.append((time.time(), data))

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    plan, self._replan = self._replan, None
                if plan is not None:
                    self.runner.apply(plan)
                self.runner.step(0.05)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def replan(self, plan: dict) -> None:
        with self._lock:
            self._replan = checked(plan)

    def windows(self, since: float = 0.0) -> list[dict]:
        with self._lock:
            return [d for t, d in self.records if t >= since]

    def arrivals(self) -> list[tuple[float, dict]]:
        with self._lock:
            return list(self.records)

    def entries(self, src: str, dst: str, since: float = 0.0, via: str = "probe") -> list[dict]:
        return [p for r in self.windows(since) for p in r["probes"]
                if (p["src"], p["dst"], p["via"]) == (src, dst, via)]

    def status(self) -> dict:
        return self.runner.status()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.runner.close()


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class ScriptedResponder:
    """A responder written independently of the engines (from the wire format): `decide(seq)`
    says what to do with each probe: "answer", "ignore" (as if the probe was lost: it is not
    marked seen), "drop_echo" (seen, but its echo is lost), or a float (answer after that
    many seconds)."""

    def __init__(self, addr: str, port: int, decide: Callable[[int], object]):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
        self.sock.bind((addr, port))
        self.sock.settimeout(0.1)
        self.decide = decide
        self.seen: dict[tuple, set[int]] = {}
        self.received: list[int] = []
        self.answering = True
        self._stop = threading.Event()
        self._timers: list[threading.Timer] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, anc, _f, addr = self.sock.recvmsg(65536, 256)
            except (TimeoutError, OSError):
                continue
            rx = time.time_ns()
            for level, ctype, cdata in anc:
                if level == socket.SOL_SOCKET and ctype == getattr(socket, "SO_TIMESTAMPNS", 35) and len(cdata) >= 16:
                    sec, nsec = struct.unpack_from("@qq", cdata)
                    rx = sec * 1_000_000_000 + nsec
            msg = wire.parse(data)
            if msg is None or msg.type != wire.PROBE or not self.answering:
                continue
            action = self.decide(msg.seq)
            if action == "ignore":
                continue
            self.received.append(msg.seq)
            seen = self.seen.setdefault((addr, msg.session), set())
            mask = sum(1 << i for i in range(64) if (msg.seq - 1 - i) % 2**32 in seen)
            seen.add(msg.seq)
            if action == "drop_echo":
                continue
            echo = wire.echo(wire.ECHO, msg.session, msg.seq, rx, time.time_ns(), mask, True, len(data))
            if isinstance(action, float):
                t = threading.Timer(action, self._send, (echo, addr))
                self._timers.append(t)
                t.start()
            else:
                self._send(echo, addr)

    def _send(self, echo: bytes, addr) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendto(echo, addr)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        for t in self._timers:
            t.cancel()
        self.sock.close()
