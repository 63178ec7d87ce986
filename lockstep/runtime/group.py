"""A process group that outlives its members.

``ResilientProcessGroup`` is a Python ``torch.distributed.ProcessGroup`` (PyTorch's
PyProcessGroup trampoline routes the C++ callers -- DDP's reducer, ``_broadcast_coalesced``,
``_verify_params_across_processes`` -- into these methods) wrapping one real backend per
*generation*: ``ProcessGroupGloo`` here, ``ProcessGroupNCCL`` on GPUs. DDP and the script hold
the wrapper; when a member is lost the wrapper builds the next generation's backend on a fresh
store prefix and carries on, so DDP never sees the membership change.

Every collective is an ``_Op`` with a sequence number and a *key* ``(interval, index)``: the
interval is the number of optimizer steps the rank has finished, the index counts collectives
since then. Keys are the same on every rank of a deterministic script, which is what lets a
replacement that re-runs the script line its collectives up with the group's history.

Recovery needs three things from each op, kept at the cost of one copy of its inputs:

* the inputs of the ops in flight and of the last ``RERUN_WINDOW`` completed ones are saved,
  because the backend reduces in place and a collective broken half-way leaves partial sums
  behind;
* every rank hands the backend the same ops in the same order, and an op counts as done only
  once every op before it is (the backend may finish them out of order: gloo runs two at a time,
  as in a plain job, which DDP's buckets need to overlap), so each rank's progress is a prefix
  of the sequence and the survivors' prefixes differ by a few ops at most: the ops in flight,
  more when a rooted op (a buffer broadcast) lets its root run ahead or a rank's completion was
  cut off by the failure. Re-running from the slowest survivor's position (completers discard
  the repeated results, the others restore their inputs first) gives every rank the bits a
  failure-free run would have produced;
* results of collectives that are not gradient buckets (buffer broadcasts, a user's metric
  all-reduce, anything whose value can steer the computation) are logged for the current
  interval, and for interval 0 and DDP's bucket rebuild permanently, so a replacement
  re-running the script gets the values the group really had.

The hot path (a live op) costs a Python call and the input copy. A gradient bucket that DDP's
reducer issues in backward is completed *lazily*: no Python callback runs on the backend's
thread (each one takes the GIL and wakes a thread); one autograd final callback per backward,
queued with its first bucket, waits on the backend's works on the thread running backward and
completes the buckets in order before DDP's own finalizer reads them. Any completion (a
callback, the final callback, a freeze) first takes every finished op ahead of it, so ops are
done in issue order. Other ops, and NCCL's (whose works finish on streams), keep the callback.
In bench/goodput's 4-rank job (blocks of steps alternating inside one job) the lazy completion
took the runtime from +8.7 % to +5.1 % CPU per step, and gloo's two threads instead of one
from +11 % to +7.8 %: one thread could not overlap DDP's two buckets.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from lockstep.orchestrator.core import RERUN_WINDOW

# A collective key: (interval, index within the interval).
Key = tuple[int, int]

_C10D_FILE = "distributed_c10d.py"
_AUTOGRAD_DIR = os.path.join("torch", "autograd", "")
# How long a lazy completion waits on the backend before it looks whether a recovery took the
# op over (a peer lost without a reset leaves the old backend's work hanging).
_LAZY_POLL = timedelta(milliseconds=100)
_engine = torch.autograd.Variable._execution_engine
_LOG_OP_LIMIT = 8 << 20  # results larger than this are not logged (counted as unlogged)
_PERMANENT_LOG_LIMIT = 64 << 20

# Set while DDP's reducer rebuilds its buckets (see patches.LockstepReducer): the broadcasts it
# issues then are logged permanently, because a replacement re-running the script needs rank 0's
# bucket layout, not its own.
_tags = threading.local()


def current_tag() -> str | None:
    return getattr(_tags, "tag", None)


class tagged:
    """Context manager marking the collectives issued inside it (thread-local)."""

    def __init__(self, tag: str):
        self.tag = tag

    def __enter__(self):
        self.prev = getattr(_tags, "tag", None)
        _tags.tag = self.tag

    def __exit__(self, *exc):
        _tags.tag = self.prev


class GroupLost(RuntimeError):
    """The job could not recover this group; raised into the waiting collective."""


class _Op:
    __slots__ = ("seq", "key", "kind", "grad", "tag", "outputs", "saved", "launch", "restore", "future", "value",
                 "work", "gen", "finished")

    def __init__(self, kind, outputs, saved, launch, restore, value):
        self.kind = kind
        self.outputs = outputs  # flat list of the tensors the op writes (what a log replays)
        self.saved = saved  # copies of its inputs (None when the op reads nothing it writes)
        self.launch = launch  # launch(backend, discard) -> Work
        self.restore = restore  # puts the saved inputs back into the user's tensors
        self.value = value  # what the future resolves to
        self.future = torch.futures.Future()
        self.grad = False
        self.tag = None
        self.seq = -1
        self.key = (0, 0)
        self.work = None  # the backend's work while the op completes lazily (else None)
        self.gen = None  # the generation it was last launched on
        self.finished = False  # the backend finished it (a callback said so, or a lazy look)


class _Generation:
    __slots__ = ("number", "backend")

    def __init__(self, number: int, backend):
        self.number = number
        self.backend = backend


def _succeeded(work) -> bool:
    """Whether a completed work succeeded (its wait returns at once, or raises its error)."""
    try:
        work.wait()
    except RuntimeError:
        return False
    return True


def _clone_list(tensors):
    return [t.detach().clone() for t in tensors]


def _restore_into(dst, src):
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


class ResilientProcessGroup(dist.ProcessGroup):
    """See the module docstring. ``runtime`` is the rank's ``lockstep.runtime.context.Runtime``
    (interval numbering, the replay plan of a replacement, notifications); ``backend_factory``
    builds the real backend of a generation: ``backend_factory(generation) -> Backend``."""

    def __init__(self, *, rank: int, size: int, group_id: str, runtime, backend_factory: Callable,
                 inner_name: str, timeout: timedelta, generation: int, build_now: bool = True):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self.group_id = group_id
        self.inner_name = inner_name
        self.timeout = timeout
        self._runtime = runtime
        self._factory = backend_factory
        self._lock = threading.Lock()
        self._gen: _Generation | None = None
        self._broken = False
        self._next_seq = 1
        self._resume_seq: int | None = None  # a replacement's first live op takes this number
        self._interval = -1
        self._index = 0
        self._inflight: collections.deque[_Op] = collections.deque()
        self._queued: list[_Op] = []  # issued while the generation is broken
        self._done_recent: collections.deque[_Op] = collections.deque(maxlen=RERUN_WINDOW)  # inputs kept
        self._lazy: list[_Op] = []  # this backward's buckets, completed by its final callback
        # Gloo's works finish on the CPU; an NCCL work's wait() orders streams instead, and its
        # future completes once the kernels are queued: NCCL keeps the callback.
        self._lazy_ok = inner_name == "gloo"
        self._lazy_task: int | None = None  # the backward whose final callback is queued
        self.done_seq = 0
        self.done_key: Key | None = None
        self.interval_log: dict[Key, list[torch.Tensor]] = {}
        self.permanent_log: dict[Key, list[torch.Tensor]] = {}
        self.rebuild_log: list[list[torch.Tensor]] = []
        self._permanent_bytes = 0
        self.unlogged: set[Key] = set()
        self.unprotected_ops: set[str] = set()
        self._rebuild_served = 0
        self._target = generation
        # Backends of past generations are kept alive for good: the last reference to one must
        # not drop on one of its own threads (a completion callback), whose destructor would
        # then join itself and abort the process.
        self._retired: list[_Generation] = []
        if build_now:
            # Built on a thread: if a member dies before the group is first formed, the main
            # thread waits on a collective (recoverable), never inside the backend's constructor.
            self._build_async(generation)

    # -- identity (what DDP and dist.* ask) -------------------------------------------------

    def getBackendName(self):  # noqa: N802 (the C++ name the trampoline looks up)
        # Not the inner name: C++ (DDP's logger) would look up a registered backend by it.
        # dist.get_backend() reports the inner name (patches.get_backend).
        return "lockstep"

    def getRank(self):  # noqa: N802
        return self._rank

    def getSize(self):  # noqa: N802
        return self._size

    def __repr__(self):
        gen = self._gen.number if self._gen else None
        return f"ResilientProcessGroup({self.group_id}, rank={self._rank}/{self._size}, gen={gen})"

    @property
    def generation(self) -> int | None:
        return self._gen.number if self._gen else None

    @property
    def backend(self):
        return self._gen.backend if self._gen else None

    # -- issuing --------------------------------------------------------------------------

    def _issue(self, op: _Op):
        rt = self._runtime
        grad = lazy = False
        if op.kind == "allreduce" and torch._C._current_graph_task_id() != -1:
            # Inside backward and not called from torch.distributed's Python API: DDP's reducer
            # (a gradient bucket). Its result only feeds .grad, so a replacement may skip it.
            try:
                caller = sys._getframe(2).f_code.co_filename
            except ValueError:  # called from a thread with no Python frames (autograd device thread)
                caller = ""
            grad = not caller.endswith(_C10D_FILE)
            # Issued by a C++ autograd hook (the frame below is where backward entered the
            # engine): nothing waits for it before the backward ends, so its final callback may
            # complete it. Python code in backward (a hook, a functional collective) may wait.
            lazy = grad and self._lazy_ok and (not caller or _AUTOGRAD_DIR in caller)
        op.grad = grad
        op.tag = current_tag()
        if grad and rt.first_grad_op_pending:
            rt.on_first_grad_op()
        if rt._fault and grad:
            rt.fault_point("grad", self._index if rt.step_no == self._interval else 0)
        decision = "live"
        with self._lock:
            interval = rt.step_no
            if interval != self._interval:
                self._interval = interval
                self._index = 0
                self.interval_log = {}
            op.key = (interval, self._index)
            self._index += 1
            if rt.replaying:
                decision = rt.replay_decision(self.group_id, op.key, grad)
            if decision == "live" and self._resume_seq is not None:
                # A replacement's numbering joins the group's: its first live op is the one the
                # slowest survivor runs next, so a later recovery compares like with like.
                self._next_seq, self._resume_seq = self._resume_seq, None
            op.seq = self._next_seq
            self._next_seq += 1
            if decision == "live":
                if self._broken or self._gen is None:
                    self._queued.append(op)
                    decision = "queued"
                else:
                    self._inflight.append(op)
                    gen = self._gen
        if decision == "live":
            self._launch(op, gen, lazy=lazy)
        elif decision != "queued":
            self._complete_locally(op, decision)
        return _create_work_from_future(op.future)

    def _launch(self, op: _Op, gen: _Generation, discard: bool = False, lazy: bool = False):
        """Start ``op`` on ``gen``'s backend. ``lazy``: a gradient bucket issued in backward (and
        not under the lock), which this backward's final callback may complete."""
        try:
            work = op.launch(gen.backend, discard)
        except Exception as exc:  # the backend refused synchronously (a dead pair, usually)
            self._on_error(gen, exc)
            return
        if discard:
            work.get_future().add_done_callback(lambda fut: self._on_discard_done(gen, fut))
            return
        op.gen = gen
        op.finished = False
        if lazy and self._complete_lazily(op, work):
            return
        op.work = None
        work.get_future().add_done_callback(lambda fut: self._on_done(op, gen, fut))

    def _complete_lazily(self, op: _Op, work) -> bool:
        """Leave ``op`` to this backward's final callback (queued with its first bucket; a
        backward that raised never ran its callback, so the next one takes its ops too)."""
        task = torch._C._current_graph_task_id()
        with self._lock:
            first = task != self._lazy_task
            self._lazy_task = task
            op.work = work
            self._lazy.append(op)
        if first:
            try:
                _engine.queue_callback(self._complete_backward)
            except RuntimeError:  # not inside a backward pass after all: a callback completes it
                with self._lock:
                    self._lazy.remove(op)
                    self._lazy_task = None
                    op.work = None
                return False
        return True

    def _complete_backward(self):
        """The autograd final callback: wait for this backward's buckets, in order, and complete
        them (DDP's finalizer, queued after the last bucket, then finds them done)."""
        with self._lock:
            ops, self._lazy, self._lazy_task = self._lazy, [], None
        for op in ops:
            self._await_lazy(op)

    def _await_lazy(self, op: _Op):
        """Complete ``op`` once its backend work finished; a recovery may take it over meanwhile.
        Raises ``GroupLost`` (out of backward) when the job cannot recover."""
        while not op.future.done():
            with self._lock:
                work, gen = op.work, op.gen
            if work is None:  # a recovery took it over: its re-run's callback completes it
                break
            try:
                work.wait(_LAZY_POLL)
                ok = True
            except RuntimeError as exc:
                if not work.is_completed():
                    continue  # it timed out: look again
                ok = _succeeded(work)  # (it may have finished just after the timeout)
                if not ok:  # it failed: a peer is gone
                    self._on_error(gen, exc)
            with self._lock:
                done = []
                if op.work is work:
                    if ok:
                        op.finished = True
                        done = self._advance()
                    else:
                        op.work = None  # from now on only a recovery completes it
                frozen = self._broken or op.gen is not self._gen
            self._complete(done)
            if frozen:
                break  # a recovery re-runs or completes it (or fails the job)
        op.future.wait()

    def _advance(self) -> list[_Op]:
        """Mark done, in issue order, the ops at the head of ``_inflight`` that the backend has
        finished (a lazy op's work is asked). Under the lock; returns the ops to complete."""
        done = []
        if self._broken:
            return done
        while self._inflight:
            op = self._inflight[0]
            if not op.finished:
                work = op.work
                if work is None or op.gen is not self._gen or not work.is_completed() or not _succeeded(work):
                    break
                op.finished = True
            self._inflight.popleft()
            op.work = None
            self.done_seq = op.seq
            self.done_key = op.key
            if len(self._done_recent) == RERUN_WINDOW:
                self._done_recent[0].saved = None
            self._done_recent.append(op)
            if not op.grad:
                self._log_result(op)
            done.append(op)
        return done

    @staticmethod
    def _complete(ops: list[_Op]):
        for op in ops:
            if not op.future.done():
                op.future.set_result(op.value)

    def _on_done(self, op: _Op, gen: _Generation, fut):
        try:
            fut.value()
        except Exception as exc:
            self._on_error(gen, exc)
            return
        with self._lock:
            if gen is not self._gen or self._broken:
                return  # a stale generation, or one frozen for recovery: the op will re-run
            op.finished = True
            done = self._advance()
        self._complete(done)

    def _on_discard_done(self, gen: _Generation, fut):
        try:
            fut.value()
        except Exception as exc:
            self._on_error(gen, exc)

    def _on_error(self, gen: _Generation, exc: BaseException):
        with self._lock:
            if gen is not self._gen or self._broken:
                return
            self._broken = True
        self._runtime.on_group_error(self, gen.number, exc)

    def _log_result(self, op: _Op):
        size = sum(t.numel() * t.element_size() for t in op.outputs)
        if size > _LOG_OP_LIMIT:
            self.unlogged.add(op.key)
            return
        copies = [t.detach().clone() for t in op.outputs]
        if op.tag == "ddp-rebuild":
            self.rebuild_log.append(copies)
        elif op.key[0] == 0 and self._permanent_bytes + size <= _PERMANENT_LOG_LIMIT:
            self.permanent_log[op.key] = copies
            self._permanent_bytes += size
        self.interval_log[op.key] = copies

    def _complete_locally(self, op: _Op, decision: str):
        """A replacement's op that the group already completed: fill its outputs from a log of
        the group's results, or leave a shape-correct stand-in (a phantom) when the value cannot
        matter (gradient buckets before the state is loaded, anything during fast-forward)."""
        logged = None
        if op.tag == "ddp-rebuild":
            logged = self._runtime.served_rebuild(self.group_id, self._rebuild_served)
            self._rebuild_served += 1
        elif decision == "log":
            logged = self._runtime.served_result(self.group_id, op.key)
        elif decision == "phantom" and op.key[0] == 0 and not op.grad:
            logged = self._runtime.served_permanent(self.group_id, op.key)
        if logged is not None:
            if [tuple(t.shape) for t in logged] != [tuple(t.shape) for t in op.outputs]:
                self._runtime.diverged(
                    f"collective {op.kind} at {op.key} of group {self.group_id}: the replacement "
                    f"issued shapes {[tuple(t.shape) for t in op.outputs]}, the group logged "
                    f"{[tuple(t.shape) for t in logged]}")
            for dst, src in zip(op.outputs, logged, strict=True):
                dst.copy_(src)
        else:
            _PHANTOMS[op.kind](self, op)
            if decision == "log":
                self._runtime.note_inexact(f"{op.kind} at {op.key} (group {self.group_id}) had no logged result")
        op.future.set_result(op.value)

    # -- recovery (called by the control thread) -------------------------------------------

    def freeze(self) -> dict:
        """Stop accepting completions from the current generation and report progress."""
        with self._lock:
            done = self._advance()  # what the backend finished is done, lazy or not
            self._broken = True
            report = {
                "group": self.group_id,
                "done_seq": self.done_seq,
                "done_key": list(self.done_key) if self.done_key else None,
                "last_done_saved": bool(self._done_recent) and self._done_recent[-1].saved is not None,
                "inflight": [[op.seq, list(op.key), op.kind] for op in self._inflight],
                "queued": [[op.seq, list(op.key), op.kind] for op in self._queued],
                "unprotected": sorted(self.unprotected_ops),
            }
        self._complete(done)
        return report

    def rebuild(self, generation: int, rerun_from_seq: int | None):
        """Build generation ``generation`` (blocks until every member has joined) and re-run,
        in order, the ops from ``rerun_from_seq`` on: one this rank already completed is re-run
        with its saved inputs into scratch outputs, the others into the user's tensors."""
        with self._lock:
            self._target = generation
        backend = self._factory(generation)
        gen = _Generation(generation, backend)
        with self._lock:
            if generation != self._target:
                self._retired.append(gen)
                return
            if self._gen is not None:
                self._retired.append(self._gen)
            self._gen = gen
            rerun = list(self._inflight) + self._queued
            self._queued = []
            self._inflight = collections.deque(rerun)
            repeat = [op for op in self._done_recent if rerun_from_seq is not None and op.seq >= rerun_from_seq]
            for op in rerun:
                if op.restore is not None:
                    op.restore()
            self._broken = False
            # Launching under the lock keeps ops issued meanwhile behind the re-runs.
            for op in repeat:
                self._launch(op, gen, discard=True)
            for op in rerun:
                self._launch(op, gen)

    def _build_async(self, generation: int):
        def build():
            try:
                backend = self._factory(generation)
            except Exception as exc:
                with self._lock:
                    stale = generation != self._target
                if not stale:
                    self._runtime.on_group_error(self, generation, exc)
                return
            self._adopt(generation, backend)

        threading.Thread(target=build, name=f"lockstep-build-{self.group_id}-{generation}", daemon=True).start()

    def _adopt(self, generation: int, backend, replacement: bool = False):
        with self._lock:
            if generation != self._target:
                return  # superseded while it was being built (a member died meanwhile)
            if self._gen is not None:
                self._retired.append(self._gen)
            self._gen = _Generation(generation, backend)
            if self._broken and not replacement:
                return  # frozen for a recovery meanwhile: the rebuild runs what is queued
            self._broken = False
            queued, self._queued = self._queued, []
            for op in queued:
                self._inflight.append(op)
                self._launch(op, self._gen)

    def join_live(self, generation: int, live_after: Key | None = None, resume_seq: int | None = None):
        """A replacement's first live generation (it has no history to re-run). ``live_after``
        and ``resume_seq``: the last op every survivor completed and the group's sequence number
        of the op after it, which this rank's next live op takes."""
        with self._lock:
            self._target = generation
            if resume_seq is not None:
                self._resume_seq = resume_seq
                self.done_seq = resume_seq - 1
                self.done_key = live_after
                self._done_recent.clear()
        self._adopt(generation, self._factory(generation), replacement=True)

    def fail(self, message: str):
        """The job cannot recover: every waiting collective raises ``GroupLost``."""
        with self._lock:
            self._broken = True
            ops = list(self._inflight) + self._queued
            self._inflight.clear()
            self._queued = []
        for op in ops:
            if not op.future.done():
                op.future.set_exception(GroupLost(message))

    def close(self):
        with self._lock:
            gen = self._gen
        if gen is not None:
            with contextlib.suppress(Exception):  # a backend of a dead generation may refuse
                gen.backend.shutdown()

    # -- the collectives ------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        saved = _clone_list(tensors)

        def launch(backend, discard):
            return backend.allreduce(_clone_list(saved) if discard else tensors, opts)

        return self._issue(_Op("allreduce", tensors, saved, launch, lambda: _restore_into(tensors, saved), tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        saved = _clone_list(tensors)

        def launch(backend, discard):
            return backend.allreduce_coalesced(_clone_list(saved) if discard else tensors, opts)

        return self._issue(_Op("allreduce", tensors, saved, launch, lambda: _restore_into(tensors, saved), tensors))

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank == self._rank
        saved = _clone_list(tensors) if root else None

        def launch(backend, discard):
            if discard:
                bufs = _clone_list(saved) if root else [torch.empty_like(t) for t in tensors]
                return backend.broadcast(bufs, opts)
            return backend.broadcast(tensors, opts)

        restore = (lambda: _restore_into(tensors, saved)) if root else None
        return self._issue(_Op("broadcast", tensors, saved, launch, restore, tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllgatherOptions()
        saved = _clone_list(input_tensors)
        flat = [t for out in output_tensors for t in out]

        def launch(backend, discard):
            outs = [[torch.empty_like(t) for t in out] for out in output_tensors] if discard else output_tensors
            return backend.allgather(outs, saved, opts)

        return self._issue(_Op("allgather", flat, saved, launch, None, output_tensors))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = opts or dist.AllgatherOptions()
        saved = _clone_list(input_list)
        flat = [t for out in output_lists for t in out]

        def launch(backend, discard):
            outs = [[torch.empty_like(t) for t in out] for out in output_lists] if discard else output_lists
            return backend.allgather_coalesced(outs, saved, opts)

        return self._issue(_Op("allgather", flat, saved, launch, None, output_lists))

    def _allgather_base(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        saved = input.detach().clone()

        def launch(backend, discard):
            return backend._allgather_base(torch.empty_like(output) if discard else output, saved, opts)

        return self._issue(_Op("allgather_base", [output], [saved], launch, None, [output]))

    all_gather_single = _allgather_base

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        saved = _clone_list(tensors)

        def launch(backend, discard):
            return backend.reduce(_clone_list(saved) if discard else tensors, opts)

        return self._issue(_Op("reduce", tensors, saved, launch, lambda: _restore_into(tensors, saved), tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        saved = [_clone_list(lst) for lst in input_tensors]

        def launch(backend, discard):
            outs = [torch.empty_like(t) for t in output_tensors] if discard else output_tensors
            return backend.reduce_scatter(outs, [_clone_list(lst) for lst in saved], opts)

        return self._issue(_Op("reduce_scatter", output_tensors, saved, launch, None, output_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        saved = input.detach().clone()

        def launch(backend, discard):
            return backend._reduce_scatter_base(torch.empty_like(output) if discard else output, saved.clone(), opts)

        return self._issue(_Op("reduce_scatter_base", [output], [saved], launch, None, [output]))

    reduce_scatter_single = _reduce_scatter_base

    def barrier(self, opts=None):
        opts = opts or dist.BarrierOptions()
        return self._issue(_Op("barrier", [], None, lambda backend, discard: backend.barrier(opts), None, []))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        saved = _clone_list(input_tensors)
        flat = [t for out in output_tensors for t in out]

        def launch(backend, discard):
            outs = [[torch.empty_like(t) for t in out] for out in output_tensors] if discard else output_tensors
            return backend.gather(outs, saved, opts)

        return self._issue(_Op("gather", flat, saved, launch, None, output_tensors))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        saved = [_clone_list(lst) for lst in input_tensors]

        def launch(backend, discard):
            outs = [torch.empty_like(t) for t in output_tensors] if discard else output_tensors
            return backend.scatter(outs, saved, opts)

        return self._issue(_Op("scatter", output_tensors, saved, launch, None, output_tensors))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        saved = input.detach().clone()

        def launch(backend, discard):
            out = torch.empty_like(output) if discard else output
            return backend.alltoall_base(out, saved, output_split_sizes, input_split_sizes, opts)

        return self._issue(_Op("alltoall", [output], [saved], launch, None, [output]))

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.AllToAllOptions()
        saved = _clone_list(input_tensors)

        def launch(backend, discard):
            outs = [torch.empty_like(t) for t in output_tensors] if discard else output_tensors
            return backend.alltoall(outs, saved, opts)

        return self._issue(_Op("alltoall", output_tensors, saved, launch, None, output_tensors))

    # Point-to-point traffic involves two ranks, not the whole group: the one-op-apart invariant
    # recovery relies on does not hold for it. It passes through, and the job is reported as
    # not protected from a hard failure while it uses it.

    def send(self, tensors, dst, tag):
        self._note_unprotected("send")
        return self._passthrough(lambda backend: backend.send(tensors, dst, tag))

    def recv(self, tensors, src, tag):
        self._note_unprotected("recv")
        return self._passthrough(lambda backend: backend.recv(tensors, src, tag))

    def recv_anysource(self, tensors, tag):
        self._note_unprotected("recv")
        return self._passthrough(lambda backend: backend.recv_anysource(tensors, tag))

    def _note_unprotected(self, what: str):
        if what not in self.unprotected_ops:
            self.unprotected_ops.add(what)
            self._runtime.note_unprotected(f"point-to-point {what} on group {self.group_id}")

    def _passthrough(self, call):
        if self._runtime.replaying:
            raise GroupLost("a replacement cannot replay point-to-point send/recv")
        with self._lock:
            gen = self._gen
        return call(gen.backend)


def _phantom_none(pg, op):
    """The op's outputs already hold a valid stand-in (its own input)."""


def _phantom_allgather(pg, op):
    outs = op.value
    ins = op.saved
    for out in outs:
        for t, src in zip(out, ins * len(out), strict=False):
            t.copy_(src)


def _phantom_allgather_base(pg, op):
    out = op.outputs[0]
    src = op.saved[0].reshape(-1)
    flat = out.view(-1)
    n = src.numel()
    for i in range(0, flat.numel(), n):
        flat[i:i + n].copy_(src[: flat.numel() - i])


def _phantom_reduce_scatter(pg, op):
    for out, lst in zip(op.outputs, op.saved, strict=False):
        out.copy_(lst[pg.rank() % len(lst)])


def _phantom_reduce_scatter_base(pg, op):
    out = op.outputs[0]
    src = op.saved[0].reshape(-1)
    n = out.numel()
    start = (pg.rank() * n) % max(src.numel(), 1)
    out.view(-1).copy_(src[start:start + n])


def _phantom_gather(pg, op):
    for out in op.value:
        for t in out:
            t.copy_(op.saved[0])


def _phantom_scatter(pg, op):
    if op.saved:
        for out, lst in zip(op.outputs, op.saved, strict=False):
            out.copy_(lst[pg.rank() % len(lst)])


def _phantom_alltoall(pg, op):
    for out, src in zip(op.outputs, op.saved, strict=False):
        if out.shape == src.shape:
            out.copy_(src)
        else:
            out.zero_()


_PHANTOMS = {
    "allreduce": _phantom_none,
    "broadcast": _phantom_none,
    "reduce": _phantom_none,
    "barrier": _phantom_none,
    "allgather": _phantom_allgather,
    "allgather_base": _phantom_allgather_base,
    "reduce_scatter": _phantom_reduce_scatter,
    "reduce_scatter_base": _phantom_reduce_scatter_base,
    "gather": _phantom_gather,
    "scatter": _phantom_scatter,
    "alltoall": _phantom_alltoall,
}
