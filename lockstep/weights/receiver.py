"""The receiving side of a rollout replica, in a process of its own (``WeightReplica`` starts it).

It holds the connection to the publisher's leader and the data links, and writes every incoming
version into two buffers per tensor in shared memory (a memfd the replica maps): only into the
buffers the replica's running version does not use. When every stream of a version is in, it
*offers* the version to the replica (``offer {version, mapping}``: which of the two buffers of each
tensor holds it); the replica swaps it in at its next ``hold()`` and answers ``applied``.

Being another process, nothing here can make a rollout step wait: not its threads' Python (no
shared GIL), not a lock (the replica keeps its own). The one exchange that needs an answer is a
*retract*: a newer version starts arriving while an offered one is not applied yet, and its
buffers are about to be overwritten. The receiver asks on a socket of its own, which a thread of
the replica answers (``declined``, or the ``applied`` it had already sent), and only then writes.

Channel to the replica, frames (pickles, ``lockstep.capture.channel``):
  replica -> receiver: ``init {address, name, token, reconnect, connect_timeout_s}`` (with the
  retract socket), ``applied version mapping``, ``declined version``
  receiver -> replica: ``layout layout capacity`` (with the buffers' memfd), ``offer version
  mapping``, ``error text``; on the retract socket: ``retract version``
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from lockstep.capture.arena import Arena, Layout
from lockstep.capture.channel import Channel, ChannelClosed, serve_background
from lockstep.weights.links import PairGroupLink, TcpLink
from lockstep.weights.protocol import ProtocolError, parse_layout, parse_segments, recv_frame, send_frame


def buffer_layout(layout: list) -> Layout:
    """Two slots per tensor, the tensor's buffers 0 and 1, in layout order."""
    return Layout.of([(f"{key}/{b}", dtype, shape) for key, dtype, shape, _ in layout for b in (0, 1)])


class _Receiving:
    def __init__(self, version: int, send: list[int], changed_at: list[int], active: list[int] | None, dest: dict[int, int]):
        self.version = version
        self.send = send
        self.changed_at = changed_at
        self.active = active  # the replica's mapping; it cannot change while this version arrives
        self.dest = dest  # tensor -> buffer it is written into
        self.streams_done: set[int] = set()


class Receiver:
    def __init__(self, channel: Channel, retract: Channel, init: dict):
        self.channel, self.retract = channel, retract
        self.address = (init["address"][0], int(init["address"][1]))
        self.name = init["name"]
        self._token = init["token"] or ""
        self._reconnect = init["reconnect"]
        self._connect_timeout = init["connect_timeout_s"]
        self._lock = threading.Lock()  # receivers' bookkeeping: _receiving, _buffer_version
        self._state = threading.Condition()  # what the replica runs and what is offered to it
        self._keys: list[str] = []
        self._layout: list | None = None
        self._arena: Arena | None = None
        self._raw: list[list[memoryview | None]] = []
        self._buffer_version: list[list[int]] = []
        self._receiving: _Receiving | None = None
        self._active: list[int] | None = None  # the replica's running mapping
        self._offered: int | None = None  # a version offered and not yet applied or declined
        self._sock: socket.socket | None = None
        self._send_lock = threading.Lock()  # frames to the leader are written whole
        self._closed = False

    # -- the replica's side ---------------------------------------------------------------------

    def _read_replica(self) -> None:
        try:
            while True:
                msg, _ = self.channel.recv()
                with self._state:
                    if msg[0] == "applied":
                        _, version, mapping = msg
                        self._active = mapping
                        if self._offered == version:
                            self._offered = None
                    elif msg[0] == "declined" and self._offered == msg[1]:
                        self._offered = None
                    self._state.notify_all()
                if msg[0] == "applied":
                    self._leader({"op": "applied", "version": msg[1]})
        except (ChannelClosed, OSError):
            pass
        self._closed = True  # the replica is gone: so is this process
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._state:
            self._state.notify_all()

    def _error(self, text: str) -> None:
        with contextlib.suppress(ChannelClosed, OSError):
            self.channel.send(("error", text))

    def _settle_offer(self) -> None:
        """Before overwriting buffers: the offered version is applied (its buffers in use) or declined."""
        with self._state:
            if self._offered is None:
                return
            self.retract.send(("retract", self._offered))
            while self._offered is not None and not self._closed:
                self._state.wait()
            if self._closed:
                raise ConnectionError("the replica went away")

    # -- the leader's side ----------------------------------------------------------------------

    def _leader(self, frame: dict) -> None:
        with self._send_lock:
            sock = self._sock
            if sock is not None:
                with contextlib.suppress(OSError):  # a closed session: the control loop reconnects
                    send_frame(sock, frame)

    def _allocate(self, layout: list) -> None:
        if self._layout is not None:
            if [(k, d, s) for k, d, s, _ in layout] != [(k, d, s) for k, d, s, _ in self._layout]:
                raise ProtocolError("the publisher's tensors differ from the ones this replica holds")
            return
        buffers = buffer_layout(layout)
        self._arena = Arena(buffers.nbytes, name="lockstep-weights-replica")
        self._layout = layout
        self._keys = [k for k, _, _, _ in layout]
        slots = buffers.slots
        self._raw = [[self._arena.memoryview(s.offset, s.nbytes) if s.nbytes else None for s in slots[2 * i : 2 * i + 2]] for i in range(len(layout))]
        self._buffer_version = [[-1, -1] for _ in layout]
        self.channel.send(("layout", layout, self._arena.capacity), fds=[self._arena.fd])

    def _begin(self, header: dict) -> _Receiving:
        version = header.get("version")
        if not isinstance(version, int):
            raise ProtocolError("data header without a version")
        with self._lock:
            rec = self._receiving
            if rec is not None and rec.version == version:
                return rec
            send, changed_at = header.get("send"), header.get("changed_at")
            n = len(self._keys)
            if not (isinstance(send, list) and isinstance(changed_at, list) and len(changed_at) == n):
                raise ProtocolError("data header needs send and changed_at for every tensor")
            if not all(isinstance(i, int) and 0 <= i < n for i in send) or not all(isinstance(v, int) for v in changed_at):
                raise ProtocolError("data header: bad send or changed_at")
            self._settle_offer()  # nothing is offered now, so the replica's mapping stays as it is
            active = self._active
            dest = {}
            for i in send:
                dest[i] = 0 if active is None else 1 - active[i]
                self._buffer_version[i][dest[i]] = -1
            rec = self._receiving = _Receiving(version, send, changed_at, active, dest)
            return rec

    def _finish(self, rec: _Receiving, stream: int, streams: int) -> None:
        with self._lock:
            if self._receiving is not rec:
                return
            rec.streams_done.add(stream)
            if len(rec.streams_done) < streams:
                return
            self._receiving = None
            for i in rec.send:
                self._buffer_version[i][rec.dest[i]] = rec.version
            mapping = []
            for i, need in enumerate(rec.changed_at):
                prefer = [rec.active[i], 1 - rec.active[i]] if rec.active is not None else [0, 1]
                valid = [b for b in prefer if self._buffer_version[i][b] >= need]
                if not valid:
                    self._error(f"version {rec.version}: no valid buffer for {self._keys[i]!r}")
                    self._leader({"op": "resync"})
                    return
                mapping.append(valid[0])
            # To the leader first: a replica that exits on taking this version must not take the
            # acknowledgement with it. The leader's next version waits for this lock in _begin.
            self._leader({"op": "received", "version": rec.version})
            with self._state:
                self._offered = rec.version
            self.channel.send(("offer", rec.version, mapping))

    def _receive_loop(self, link, stream: int, streams: int, sizes: list[int]) -> None:
        try:
            while True:
                header = link.recv_header()
                rec = self._begin(header)
                segments = parse_segments(header.get("segments"), sizes)
                for t, _, _ in segments:
                    if t not in rec.dest:
                        raise ProtocolError(f"segment for tensor {t}, which this version does not send")
                link.recv_segments([self._raw[t][rec.dest[t]][off : off + n] for t, off, n in segments])
                self._finish(rec, stream, streams)
        except (OSError, ConnectionError, ProtocolError, RuntimeError, ValueError, ChannelClosed) as exc:
            if not self._closed:
                self._error(f"stream {stream}: {exc!r}")
            sock = self._sock
            if sock is not None:  # one broken stream: start over on a fresh connection
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        finally:
            link.close()

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self._connect_timeout
        delay = 0.05
        while True:
            try:
                return socket.create_connection(self.address, timeout=10)
            except OSError as exc:
                if time.monotonic() > deadline or self._closed:
                    raise ConnectionError(f"cannot reach the publisher at {self.address}: {exc}") from exc
                time.sleep(delay)  # back off while the publisher (re)starts
                delay = min(delay * 2, 2.0)

    def _session(self) -> None:
        sock = self._connect()
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._send_lock:
            send_frame(sock, {"op": "hello", "replica": self.name, "token": self._token})
            self._sock = sock
        if self._closed:  # the replica went away while this connected
            return
        layout_frame = recv_frame(sock)
        if layout_frame.get("op") == "refused":
            raise PermissionError(f"publisher refused replica {self.name}: {layout_frame.get('error')}")
        if layout_frame.get("op") != "layout":
            raise ProtocolError(f"expected layout, got {layout_frame.get('op')!r}")
        layout = parse_layout(layout_frame.get("tensors"))
        streams, epoch = int(layout_frame["streams"]), int(layout_frame["epoch"])
        with self._lock:
            self._allocate(layout)
            self._receiving = None
        sizes = [nbytes for _, _, _, nbytes in layout]
        links = []
        if layout_frame["transport"] == "tcp":
            # The leader listens on the host this replica reached it at; the frame names the ports.
            port = int(layout_frame["data_port"])
            for k in range(streams):
                data = socket.create_connection((self.address[0], port), timeout=30)
                data.settimeout(None)
                send_frame(data, {"op": "data", "replica": self.name, "stream": k, "epoch": epoch, "token": self._token})
                links.append(TcpLink(data))
        else:
            import torch.distributed as dist

            store = dist.TCPStore(self.address[0], int(layout_frame["store_port"]), is_master=False)
            prefix = f"lockstep-weights/{layout_frame['publisher']}/{self.name}/{epoch}"
            links = [PairGroupLink(store, f"{prefix}/{k}", 1) for k in range(streams)]
        threads = [threading.Thread(target=self._receive_loop, args=(lk, k, streams, sizes), daemon=True) for k, lk in enumerate(links)]
        for t in threads:
            t.start()
        try:
            while True:
                frame = recv_frame(sock)  # the leader sends nothing after the layout today
                if frame.get("op") == "refused":
                    raise PermissionError(str(frame.get("error")))
        finally:
            with self._send_lock:
                self._sock = None
            with contextlib.suppress(OSError):
                sock.close()
            for lk in links:
                lk.close()
            for t in threads:
                t.join(timeout=30)

    def run(self) -> None:
        threading.Thread(target=self._read_replica, name="replica", daemon=True).start()
        while not self._closed:
            try:
                self._session()
            except PermissionError as exc:
                self._error(str(exc))
                return
            except (OSError, ConnectionError, ProtocolError, ValueError, KeyError, RuntimeError, ChannelClosed) as exc:
                if not self._closed:
                    self._error(repr(exc))
            if not self._reconnect:
                return


def main() -> None:
    serve_background(lambda channel, init, fds: Receiver(channel, Channel(socket.socket(fileno=fds[0])), init).run())
