"""The rollout side of a weight push: receive the next version beside the running one, then swap.

Every tensor has two buffers. Receiver threads (one per stream) write an incoming version only
into the buffers that the running version does not use; when every stream of a version is in,
it becomes *pending*. The generation loop takes the weights through :meth:`WeightReplica.hold`:
on entry, and only when no other generation holds them, a pending version is swapped in (one
pointer per changed tensor, and ``param.data`` for a bound module); inside, the weights never
change. So a generation runs on exactly one version, and a rollout step waits at most one swap.

That bound holds by construction: the lock ``hold()`` takes (``_cond``) is held by anyone else
only for a few pointer assignments (receivers keep their own bookkeeping under
``_receive_lock``, which ``hold()`` never takes; each version's name -> tensor map is built
before it becomes pending), and ``hold()`` writes to no socket (its ``applied`` goes through the
outbox thread). What a step can still lose to the push is the GIL while a receiver thread runs
Python between its transfers, which release it (``recv_into`` / gloo ``wait``);
``bench/weightpush`` measures that per step.

If a new version starts arriving while another is pending, the pending one is dropped (its
buffers are about to be overwritten) and the replica keeps running the version it has until the
new one is complete. If the publisher goes away, the replica keeps its version and reconnects;
the leader then sends it everything again.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from lockstep.weights.links import PairGroupLink, TcpLink
from lockstep.weights.protocol import ProtocolError, parse_layout, parse_segments, recv_frame, send_frame


@dataclass(frozen=True)
class Weights:
    """One version's tensors, stable for as long as it is held."""

    version: int
    tensors: Mapping[str, torch.Tensor]
    lock_wait_s: float = 0.0  # how long this hold() waited for the replica's lock
    swap_s: float = 0.0  # the swap this hold() did on entry (0: none)


class _Receiving:
    def __init__(self, version: int, send: list[int], changed_at: list[int], active: list[int] | None, dest: dict[int, int]):
        self.version = version
        self.send = send
        self.changed_at = changed_at
        self.active = active  # the running mapping; no swap can change it while this version arrives
        self.dest = dest  # tensor -> buffer it is written into
        self.streams_done: set[int] = set()


class WeightReplica:
    def __init__(
        self,
        address: tuple[str, int],
        *,
        name: str | None = None,
        token: str | None = None,
        reconnect: bool = True,
        connect_timeout_s: float = 60.0,
    ):
        self.address = (address[0], int(address[1]))
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._token = token or ""
        self._reconnect = reconnect
        self._connect_timeout = connect_timeout_s
        self._cond = threading.Condition()  # hold() and swaps; others keep it for pointer assignments only
        self._receive_lock = threading.Lock()  # receivers' bookkeeping (_receiving, _buffer_version)
        self._keys: list[str] = []
        self._layout: list | None = None
        self._buffers: list[list[torch.Tensor]] = []
        self._raw: list[list[memoryview | None]] = []
        self._buffer_version: list[list[int]] = []
        self._active: list[int] | None = None
        self._version: int | None = None
        self._tensors: Mapping[str, torch.Tensor] = MappingProxyType({})
        self._pending: tuple[int, list[int], Mapping[str, torch.Tensor]] | None = None
        self._receiving: _Receiving | None = None
        self._holders = 0
        self._bound: list[tuple[int, torch.Tensor]] = []
        self._sock: socket.socket | None = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # (socket, frame): written by one thread
        self._closed = False
        self.swaps = 0
        self.last_swap_s = 0.0
        self.max_swap_s = 0.0
        self.max_lock_wait_s = 0.0  # longest a hold() waited for a receiver thread's bookkeeping
        self.errors: list[str] = []
        self._sender = threading.Thread(target=self._send_loop, name=f"replica-{self.name}-send", daemon=True)
        self._sender.start()
        self._thread = threading.Thread(target=self._control_loop, name=f"replica-{self.name}", daemon=True)
        self._thread.start()

    # -- what a rollout loop uses ----------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The version generations run on (None before the first)."""
        return self._version

    def wait_for_version(self, at_least: int = 1, timeout: float | None = None) -> int:
        """Block until a version ``>= at_least`` is running or pending; returns it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                newest = max(v for v in (self._version, self._pending[0] if self._pending else None, -1) if v is not None)
                if newest >= at_least:
                    return newest
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"replica {self.name}: no version >= {at_least} after {timeout} s ({self.errors[-1:]})")
                self._cond.wait(left)

    @contextlib.contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[Weights]:
        """The weights of one version, unchanged until the block ends (swap to a newer one on entry)."""
        asked = time.perf_counter()
        with self._cond:
            lock_wait = time.perf_counter() - asked
            if self._version is None:
                self.wait_for_version(1, timeout)  # only before the first version
            else:
                self.max_lock_wait_s = max(self.max_lock_wait_s, lock_wait)
            swap_s = self._swap() if self._pending is not None and self._holders == 0 else 0.0
            self._holders += 1
            weights = Weights(self._version, self._tensors, lock_wait, swap_s)
        try:
            yield weights
        finally:
            with self._cond:
                self._holders -= 1

    def bind(self, module: nn.Module) -> None:
        """Make ``module``'s parameters and buffers follow the running version (same names)."""
        with self._cond:
            if self._layout is None:
                raise RuntimeError("no layout yet: call wait_for_version() first")
            index = {k: i for i, k in enumerate(self._keys)}
            own = dict(module.named_parameters())
            own.update(dict(module.named_buffers()))
            missing = sorted(set(own) - set(index))
            if missing:
                raise KeyError(f"the publisher has no tensors named {missing[:5]}")
            self._bound = [(index[name], t) for name, t in own.items()]
            if self._active is not None:
                self._rebind(range(len(self._keys)))

    def close(self) -> None:
        self._closed = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        self._outbox.put(None)
        self._sender.join(timeout=10)

    # -- swapping (under self._cond) -------------------------------------------------------------

    def _swap(self) -> float:
        started = time.perf_counter()
        version, mapping, tensors = self._pending
        self._pending = None
        old = self._active
        self._active = mapping
        self._version = version
        self._tensors = tensors
        self._rebind([i for i in range(len(mapping)) if old is None or old[i] != mapping[i]])
        self._send({"op": "applied", "version": version})
        self.swaps += 1
        self.last_swap_s = time.perf_counter() - started
        self.max_swap_s = max(self.max_swap_s, self.last_swap_s)
        return self.last_swap_s

    def _rebind(self, changed) -> None:
        wanted = set(changed)
        with torch.no_grad():
            for i, t in self._bound:
                if i in wanted:
                    t.data = self._buffers[i][self._active[i]]

    # -- receiving -------------------------------------------------------------------------------

    def _send(self, frame: dict) -> None:
        """Queue a frame for this session's control socket (never blocks: hold() calls it)."""
        sock = self._sock
        if sock is not None:
            self._outbox.put((sock, frame))

    def _send_loop(self) -> None:
        while (item := self._outbox.get()) is not None:
            sock, frame = item
            with contextlib.suppress(OSError):  # a closed session: the control loop reconnects
                send_frame(sock, frame)

    def _allocate(self, layout: list) -> None:
        if self._layout is not None:
            if [(k, d, s) for k, d, s, _ in layout] != [(k, d, s) for k, d, s, _ in self._layout]:
                raise ProtocolError("the publisher's tensors differ from the ones this replica holds")
            return
        self._layout = layout
        self._keys = [k for k, _, _, _ in layout]
        for _, dtype, shape, nbytes in layout:
            pair = [torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)]
            self._buffers.append(pair)
            self._raw.append([memoryview(b.reshape(-1).view(torch.uint8).numpy()) if nbytes else None for b in pair])
            self._buffer_version.append([-1, -1])

    def _begin(self, header: dict) -> _Receiving:
        version = header.get("version")
        if not isinstance(version, int):
            raise ProtocolError("data header without a version")
        with self._receive_lock:
            rec = self._receiving
            if rec is not None and rec.version == version:
                return rec
            send, changed_at = header.get("send"), header.get("changed_at")
            n = len(self._keys)
            if not (isinstance(send, list) and isinstance(changed_at, list) and len(changed_at) == n):
                raise ProtocolError("data header needs send and changed_at for every tensor")
            if not all(isinstance(i, int) and 0 <= i < n for i in send) or not all(isinstance(v, int) for v in changed_at):
                raise ProtocolError("data header: bad send or changed_at")
            with self._cond:
                # The buffers written now may hold the pending version: it can no longer be swapped
                # in. With nothing pending, no swap happens until this version is complete.
                self._pending = None
                active = self._active
            dest = {}
            for i in send:
                dest[i] = 0 if active is None else 1 - active[i]
                self._buffer_version[i][dest[i]] = -1
            rec = self._receiving = _Receiving(version, send, changed_at, active, dest)
            return rec

    def _finish(self, rec: _Receiving, stream: int, streams: int) -> None:
        with self._receive_lock:
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
                    self.errors.append(f"version {rec.version}: no valid buffer for {self._keys[i]!r}")
                    self._send({"op": "resync"})
                    return
                mapping.append(valid[0])
            tensors = MappingProxyType({k: self._buffers[i][mapping[i]] for i, k in enumerate(self._keys)})
            with self._cond:
                self._pending = (rec.version, mapping, tensors)
                self._cond.notify_all()
        self._send({"op": "received", "version": rec.version})

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
        except (OSError, ConnectionError, ProtocolError, RuntimeError, ValueError) as exc:
            if not self._closed:
                self.errors.append(f"stream {stream}: {exc!r}")
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
        send_frame(sock, {"op": "hello", "replica": self.name, "token": self._token})
        self._sock = sock  # from now on the outbox thread is its only writer
        layout_frame = recv_frame(sock)
        if layout_frame.get("op") == "refused":
            raise PermissionError(f"publisher refused replica {self.name}: {layout_frame.get('error')}")
        if layout_frame.get("op") != "layout":
            raise ProtocolError(f"expected layout, got {layout_frame.get('op')!r}")
        layout = parse_layout(layout_frame.get("tensors"))
        streams, epoch = int(layout_frame["streams"]), int(layout_frame["epoch"])
        with self._receive_lock, self._cond:
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
            self._sock = None
            with contextlib.suppress(OSError):
                sock.close()
            for lk in links:
                lk.close()
            for t in threads:
                t.join(timeout=30)

    def _control_loop(self) -> None:
        while not self._closed:
            try:
                self._session()
            except PermissionError as exc:
                self.errors.append(str(exc))
                return
            except (OSError, ConnectionError, ProtocolError, ValueError, KeyError, RuntimeError) as exc:
                if not self._closed:
                    self.errors.append(repr(exc))
            if not self._reconnect or self._closed:
                return
            with self._cond:
                self._cond.notify_all()
