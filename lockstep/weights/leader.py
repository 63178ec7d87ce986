"""The leader of a weight publisher: a background process that serves replicas from the arena.

It maps the trainer's arena (the latest staged version), accepts replicas at any time and sends
each one what it lacks: a late joiner or a restarted replica everything, the others the tensors
changed since the version they hold. Every (replica, stream) link has a sender thread, so a push
is striped over ``streams`` senders per replica, all replicas at once; sender threads spend
their time in ``sendall``/gloo sends, which release the GIL.

The arena is shared with the trainer, so it is handed over explicitly: the trainer asks
(``acquire``) before staging the next version, the leader answers ``free`` once no send is
reading the arena and starts none until the trainer says ``staged``. A push is ``delivered``
when every replica it was sent to has acknowledged the whole version (or is gone).

A ``pull`` push (the trainer's ``overlap``) is staged here instead: ``PULL_THREADS`` threads copy
the trainer's tensors into the arena with ``process_vm_readv``, ``PULL_CHUNK`` bytes at a time,
and the gate follows the contiguous prefix they have finished, so each chunk is sent as soon as
it is in. ``pulled`` tells the trainer its weights may change again; the arena is not handed back
and no delivery is reported before that.

A ``live`` push (a publisher made with ``share=True``, the trainer's ``overlap``) is not staged
at all: the trainer's weights live in a second shared buffer (``live``), and the senders read
them there while the trainer's optimizer steps wait. Only once every replica has the version (or
is gone) does the leader copy its changed tensors into the arena, for late joiners and restarts;
then ``pulled`` frees the trainer's weights. So the push moves each byte as often as a plain bulk
copy does (the kernel's copy out, the replica's copy in), and the copy for the arena is off its
path (replicas that join meanwhile get the version from the arena after it).

All state lives in one thread (``Leader.run``) fed by an event queue; the other threads only
read sockets and post events.
"""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import itertools
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from lockstep.capture.arena import Arena
from lockstep.capture.channel import Channel, ChannelClosed, serve_background
from lockstep.capture.pull import can_read, pull_from
from lockstep.events import AgentEvents
from lockstep.weights.links import PairGroupLink, TcpLink
from lockstep.weights.plan import needed, stripe
from lockstep.weights.protocol import ProtocolError, recv_frame, send_frame

PULL_THREADS = 4
PULL_CHUNK = 8 << 20


@dataclass
class Replica:
    name: str
    sock: socket.socket
    epoch: int
    links: dict[int, Link] = field(default_factory=dict)
    acked: int | None = None  # last version received whole
    applied: int | None = None  # version it generates with
    sending: int | None = None
    joined: float = field(default_factory=time.monotonic)
    send_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, frame: dict) -> None:
        with self.send_lock:
            send_frame(self.sock, frame)


class Gate:
    """How far into the arena the trainer has staged the version being sent (senders wait on it)."""

    def __init__(self):
        self._cond = threading.Condition()
        self.upto = 0
        self.failed: str | None = None

    def set(self, upto: float) -> None:
        with self._cond:
            self.upto, self.failed = upto, None
            self._cond.notify_all()

    def fail(self, why: str) -> None:
        """Staging failed: the senders stop before the bytes that never came (nothing torn goes out)."""
        with self._cond:
            self.failed = why
            self._cond.notify_all()

    def wait(self, end: int) -> None:
        with self._cond:
            while self.upto < end:
                if self.failed is not None:
                    raise RuntimeError(self.failed)
                self._cond.wait()


class Link:
    """A data link and the thread that sends versions on it."""

    def __init__(self, replica: str, epoch: int, stream: int, link, events: queue.Queue, slots, gate: Gate):
        self.replica, self.epoch, self.stream, self.link = replica, epoch, stream, link
        self.jobs: queue.Queue = queue.Queue()
        self._events, self._slots, self._gate = events, slots, gate
        self.thread = threading.Thread(target=self._run, name=f"send-{replica}-{stream}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            header, segments, source = job  # source: the arena, or the trainer's live weights
            try:
                parts = [(source.memoryview(self._slots[t].offset + off, n), self._slots[t].offset + off + n) for t, off, n in segments]
                self.link.send_version(header, parts, self._gate.wait)
            except Exception as exc:  # the replica went away mid-send
                self._events.put(("gone_epoch", self.replica, self.epoch, f"stream {self.stream}: {exc!r}"))
                return

    def close(self) -> None:
        self.jobs.put(None)
        self.link.close()


class Leader:
    def __init__(self, channel: Channel, init: dict, arena: Arena, live: Arena | None = None):
        self.channel = channel
        self.arena = arena
        self.live = live  # the trainer's weights themselves (share=True), same layout as the arena
        self.publisher = init["publisher"]
        self.job = init.get("job")
        self.layout = init["layout"]  # [[key, dtype, shape, nbytes]...] in arena order
        self.slots = init["slots"]  # arena Slots, same order
        self.sizes = [entry[3] for entry in self.layout]
        self.streams = init["streams"]
        self.transport = init["transport"]
        self.token = init["token"] or ""
        self.events: queue.Queue = queue.Queue()
        self.replicas: dict[str, Replica] = {}
        self.pending_links: dict[tuple[str, int], object] = {}
        self.version: int | None = None
        self.changed_at: list[int] = []
        self.gate = Gate()
        self.arena_held = False
        self.acquire_waiting = False
        self.delivery: dict | None = None
        self.pulling = False  # the trainer's weights are held for this version (pull or live push)
        self.live_version: int | None = None  # a live push: sent from the trainer's weights
        self.live_readers: set[str] = set()  # replicas still receiving it from there
        self.copying = False  # the live version's changed tensors are being copied into the arena
        self.epochs = 0
        self.notify = AgentEvents()
        host = init["host"]
        self.control = socket.create_server((host, init["port"]), backlog=128)
        self.data = socket.create_server((host, 0), backlog=128) if self.transport == "tcp" else None
        self.store = None
        if self.transport == "gloo":
            import torch.distributed as dist

            self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))

    # -- addresses ---------------------------------------------------------------------------

    def addresses(self) -> dict:
        host = self.control.getsockname()[0]
        return {
            "control": [host, self.control.getsockname()[1]],
            "data": [host, self.data.getsockname()[1]] if self.data else None,
            "store": [host, self.store.port] if self.store else None,
        }

    # -- threads that only post events --------------------------------------------------------

    def _read_trainer(self) -> None:
        while True:
            try:
                msg, _ = self.channel.recv()
            except ChannelClosed:
                self.events.put(("trainer_gone",))
                return
            self.events.put(("trainer", msg))

    def _accept_control(self) -> None:
        while True:
            try:
                sock, _ = self.control.accept()
            except OSError:
                return
            threading.Thread(target=self._read_replica, args=(sock,), daemon=True).start()

    def _read_replica(self, sock: socket.socket) -> None:
        name = None
        try:
            sock.settimeout(30)
            hello = recv_frame(sock)
            sock.settimeout(None)
            if hello.get("op") != "hello" or not isinstance(hello.get("replica"), str) or not hello["replica"]:
                raise ProtocolError("expected hello {replica, token}")
            if not hmac.compare_digest(str(hello.get("token", "")).encode(), self.token.encode()):
                send_frame(sock, {"op": "refused", "error": "bad token"})
                raise ProtocolError(f"replica {hello['replica']!r} presented a bad token")
            name = hello["replica"]
            self.events.put(("hello", name, sock))
            while True:
                frame = recv_frame(sock)
                self.events.put(("replica", name, sock, frame))
        except (OSError, ConnectionError, ProtocolError, ValueError) as exc:
            if name is None:
                sock.close()
            else:
                self.events.put(("gone", name, sock, repr(exc)))

    def _accept_data(self) -> None:
        while True:
            try:
                sock, _ = self.data.accept()
            except OSError:
                return
            threading.Thread(target=self._read_data_hello, args=(sock,), daemon=True).start()

    def _read_data_hello(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(30)
            frame = recv_frame(sock)
            sock.settimeout(None)
            if frame.get("op") != "data" or not hmac.compare_digest(str(frame.get("token", "")).encode(), self.token.encode()):
                raise ProtocolError("expected data {replica, stream, epoch, token}")
            self.events.put(("link", frame["replica"], int(frame["epoch"]), int(frame["stream"]), TcpLink(sock)))
        except (OSError, ConnectionError, ProtocolError, ValueError, KeyError):
            sock.close()

    def _open_pair_groups(self, name: str, epoch: int) -> None:
        # In stream order, as the replica does, and through a store client of this thread's own:
        # one client blocked in a rendezvous wait would hold up every other user of it.
        import torch.distributed as dist

        try:
            host = self.control.getsockname()[0]
            store = dist.TCPStore(host, self.store.port, is_master=False, timeout=timedelta(seconds=300))
            for stream in range(self.streams):
                link = PairGroupLink(store, f"lockstep-weights/{self.publisher}/{name}/{epoch}/{stream}", 0)
                self.events.put(("link", name, epoch, stream, link))
        except Exception as exc:
            self.events.put(("gone_epoch", name, epoch, repr(exc)))

    # -- the state machine ---------------------------------------------------------------------

    def run(self) -> None:
        threading.Thread(target=self._read_trainer, daemon=True).start()
        threading.Thread(target=self._accept_control, daemon=True).start()
        if self.data is not None:
            threading.Thread(target=self._accept_data, daemon=True).start()
        while True:
            event = self.events.get()
            kind = event[0]
            if kind == "trainer_gone":
                return
            if kind == "trainer":
                self._on_trainer(event[1])
            elif kind == "hello":
                self._on_hello(event[1], event[2])
            elif kind == "link":
                self._on_link(*event[1:])
            elif kind == "replica":
                self._on_frame(event[1], event[2], event[3])
            elif kind == "gone":
                self._drop(event[1], event[3], sock=event[2])
            elif kind == "pulled":
                self._on_pulled(event[1], event[2])
            elif kind == "copied":
                self._on_copied(event[1])
            elif kind == "gone_epoch":
                r = self.replicas.get(event[1])
                if r is not None and r.epoch == event[2]:
                    self._drop(event[1], event[3])
            self._maybe_grant_arena()

    def _on_trainer(self, msg) -> None:
        op = msg[0]
        if op == "acquire":
            self.acquire_waiting = True
        elif op == "staging":  # the trainer copies now; sends follow its progress
            _, version, changed_at = msg
            self.gate.set(0)
            self._begin(version, changed_at)
        elif op == "progress":
            if msg[1] == self.version:
                self.gate.set(msg[2])
        elif op == "pull":
            _, version, changed_at, pid, segments = msg
            self.gate.set(0)
            self.pulling = True
            self._begin(version, changed_at)
            threading.Thread(target=self._pull, args=(version, pid, segments), name="pull", daemon=True).start()
        elif op == "live":
            _, version, changed_at = msg
            self.gate.set(float("inf"))  # nothing to wait for: the weights are all there
            self.pulling = True
            self.live_version = version
            self._begin(version, changed_at)
            self._maybe_copy_live()
        elif op == "staged":
            _, version, changed_at = msg
            self.gate.set(float("inf"))
            if version != self.version:
                self._begin(version, changed_at)
        elif op == "status":
            self.channel.send(("status", self._status()))

    def _pull(self, version: int, pid: int, segments: list) -> None:
        """Copy the trainer's tensors into the arena, in chunks, on several threads; open the gate as they land."""
        chunks = [(remote + k, offset + k, min(PULL_CHUNK, n - k)) for remote, offset, n in segments for k in range(0, n, PULL_CHUNK)]
        done = [False] * len(chunks)
        lock = threading.Lock()
        order = itertools.count()
        prefix = [0]
        errors: list[str] = []

        def work() -> None:
            while not errors:
                with lock:
                    i = next(order)
                if i >= len(chunks):
                    return
                try:
                    pull_from(pid, self.arena, [chunks[i]])
                except OSError as exc:
                    errors.append(f"reading the trainer's weights failed: {exc}")
                    return
                with lock:
                    done[i] = True
                    while prefix[0] < len(chunks) and done[prefix[0]]:
                        prefix[0] += 1
                    if prefix[0] == len(chunks):
                        self.gate.set(float("inf"))
                    elif prefix[0]:
                        self.gate.set(chunks[prefix[0] - 1][1] + chunks[prefix[0] - 1][2])

        threads = [threading.Thread(target=work, daemon=True) for _ in range(min(PULL_THREADS, len(chunks)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.gate.fail(errors[0])
        self.events.put(("pulled", version, errors[0] if errors else None))

    def _on_pulled(self, version: int, error: str | None) -> None:
        self.pulling = False
        with contextlib.suppress(ChannelClosed):
            self.channel.send(("pulled", version, error))
        if error is not None:
            # The senders stopped at the gate; the replicas hold part of a version they never
            # apply. Drop them: they reconnect and get everything of the next version.
            for name in list(self.replicas):
                self._drop(name, error)
        self._maybe_delivered()

    def _maybe_copy_live(self) -> None:
        """Once no replica reads the live version any more, copy what changed into the arena."""
        if self.live_version is None or self.live_readers or self.copying:
            return
        self.copying = True
        version = self.live_version
        segments = [(self.slots[i].offset, self.sizes[i]) for i, v in enumerate(self.changed_at) if v == version and self.sizes[i]]
        threading.Thread(target=self._copy_live, args=(version, segments), name="copy-live", daemon=True).start()

    def _copy_live(self, version: int, segments: list[tuple[int, int]]) -> None:
        for offset, n in segments:  # ctypes releases the GIL: the senders' threads run on
            ctypes.memmove(self.arena.address + offset, self.live.address + offset, n)
        self.events.put(("copied", version))

    def _on_copied(self, version: int) -> None:
        self.copying = False
        self.live_version = None
        self._on_pulled(version, None)
        for r in self.replicas.values():  # joined while the arena was being written: send it now
            if len(r.links) == self.streams and r.sending is None and r.acked != self.version:
                self._start_send(r)

    def _begin(self, version: int, changed_at: list[int]) -> None:
        self.arena_held = False
        self.version, self.changed_at = version, changed_at
        targets = [r for r in self.replicas.values() if len(r.links) == self.streams]
        self.delivery = {"version": version, "started": time.monotonic(), "waiting": {r.name for r in targets}, "result": {}, "bytes": 0}
        for r in targets:
            self._start_send(r)
        self._maybe_delivered()

    def _on_hello(self, name: str, sock: socket.socket) -> None:
        old = self.replicas.get(name)
        if old is not None:
            self._drop(name, "reconnected")  # a restarted replica: start over with everything
        self.epochs += 1
        r = Replica(name, sock, self.epochs)
        self.replicas[name] = r
        try:
            r.send(
                {
                    "op": "layout",
                    "publisher": self.publisher,
                    "tensors": self.layout,
                    "streams": self.streams,
                    "transport": self.transport,
                    "epoch": r.epoch,
                    "data_port": self.data.getsockname()[1] if self.data else None,
                    "store_port": self.store.port if self.store else None,
                }
            )
        except OSError as exc:
            self._drop(name, repr(exc))
            return
        if self.transport == "gloo":
            threading.Thread(target=self._open_pair_groups, args=(name, r.epoch), daemon=True).start()

    def _on_link(self, name: str, epoch: int, stream: int, link) -> None:
        r = self.replicas.get(name)
        if r is None or r.epoch != epoch or not 0 <= stream < self.streams or stream in r.links:
            link.close()
            return
        r.links[stream] = Link(name, epoch, stream, link, self.events, self.slots, self.gate)
        if len(r.links) == self.streams and self.version is not None and not self.arena_held and r.sending is None:
            self._start_send(r)  # a late joiner: the latest version, whole

    def _on_frame(self, name: str, sock: socket.socket, frame: dict) -> None:
        r = self.replicas.get(name)
        if r is None or r.sock is not sock:
            return
        op = frame.get("op")
        if op == "received" and frame.get("version") == r.sending:
            r.acked, r.sending = r.sending, None
            self.live_readers.discard(name)
            self._maybe_copy_live()
            if self.delivery is not None and name in self.delivery["waiting"]:
                self.delivery["waiting"].discard(name)
                self.delivery["result"][name] = "received"
            self._maybe_delivered()
            if r.acked != self.version and not self.arena_held and self.version is not None:
                self._start_send(r)
        elif op == "applied" and isinstance(frame.get("version"), int):
            r.applied = frame["version"]
        elif op == "resync":
            r.acked = None  # it lost track of its buffers: send everything next time

    def _start_send(self, r: Replica) -> None:
        if self.copying:
            return  # the arena is being written: _on_copied starts it
        source = self.arena
        if self.live_version is not None and self.live_version == self.version:
            source = self.live
            self.live_readers.add(r.name)
        tensors = needed(self.changed_at, r.acked)
        stripes = stripe(self.sizes, tensors, self.streams)
        header_base = {"version": self.version, "send": tensors, "changed_at": self.changed_at}
        r.sending = self.version
        for k, segments in enumerate(stripes):
            r.links[k].jobs.put(({**header_base, "stream": k, "segments": [list(s) for s in segments]}, segments, source))
        if self.delivery is not None and self.delivery["version"] == self.version:
            self.delivery["bytes"] += sum(self.sizes[t] for t in tensors)

    def _drop(self, name: str, why: str, sock: socket.socket | None = None) -> None:
        r = self.replicas.get(name)
        if r is None or (sock is not None and r.sock is not sock):
            return
        del self.replicas[name]
        for link in r.links.values():
            link.close()
        if name in self.live_readers:
            self.live_readers.discard(name)
            self._maybe_copy_live()
        with contextlib.suppress(OSError):
            r.sock.close()
        if self.delivery is not None and name in self.delivery["waiting"]:
            self.delivery["waiting"].discard(name)
            self.delivery["result"][name] = f"lost: {why}"
            self._maybe_delivered()

    def _maybe_delivered(self) -> None:
        d = self.delivery
        if d is None or d["waiting"] or (self.pulling and self.live_version is None):
            return  # a live push is delivered once the replicas have it; the arena copy comes after
        self.delivery = None
        result = {
            "version": d["version"],
            "replicas": d["result"],
            "bytes": d["bytes"],
            "duration_s": time.monotonic() - d["started"],
        }
        self.notify.emit("weights.version", {"publisher": self.publisher, "job": self.job, **result, "holders": self._status()["replicas"]})
        with contextlib.suppress(ChannelClosed):
            self.channel.send(("delivered", result))

    def _maybe_grant_arena(self) -> None:
        if self.acquire_waiting and not self.pulling and all(r.sending is None for r in self.replicas.values()):
            self.acquire_waiting = False
            self.arena_held = True
            with contextlib.suppress(ChannelClosed):
                self.channel.send(("free",))

    def _status(self) -> dict:
        return {
            "version": self.version,
            "replicas": {n: {"received": r.acked, "applied": r.applied, "sending": r.sending} for n, r in self.replicas.items()},
        }


def main() -> None:
    serve_background(_serve)


def _serve(channel: Channel, init: dict, fds: list[int]) -> None:
    arena = Arena.attach(fds[0], init["capacity"])
    live = Arena.attach(fds[1], init["capacity"]) if init.get("live") else None
    leader = Leader(channel, init, arena, live)
    channel.send(("listening", {**leader.addresses(), "can_pull": can_read(init["probe"])}))
    leader.run()
