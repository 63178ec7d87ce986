"""The per-process runtime: one ``Runtime`` per training process started by ``lockstep run``.

It sees the training through the hooks in ``patches`` (process-group creation, DDP, optimizer
steps, LR schedulers, data-loader iterators), and owns:

* the step clock: ``step_no`` counts finished ``optimizer.step()`` calls; a *step boundary* is
  the moment one finishes. Collectives are keyed by ``(step_no, index)``;
* the rank's small state (``smallstate``) written at every step into its node's shared memory;
* the boundary snapshots a donor serves (scheduler state, optimizer hyper-parameters);
* orders from the orchestrator, executed by the main thread at a boundary (hold there, exit,
  capture) or by the control thread at once (freeze and rebuild the groups);
* as a replacement, the fast-forward / resume / replay phases (``replay``).

``capture_rank_state`` / ``load_rank_state`` are the hook the snapshot feature uses: every rank
holds at one boundary (``hold``), captures there, and a restore re-seeds a fresh run through the
same resume path a replacement takes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
import threading
import time
import traceback
import weakref

import torch

from lockstep.runtime import offnode, preimport, smallstate
from lockstep.runtime.replay import REAL_STEPS, SideEffects, Skeleton, signature
from lockstep.runtime.rng import RngTracker


class RankState:
    """What the runtime could discover about one rank, at one boundary."""

    def __init__(self, step_no, parameters, buffers, optimizers, schedulers, small, undiscovered):
        self.step_no = step_no
        self.parameters = parameters  # list of tensors (replicated across data-parallel ranks)
        self.buffers = buffers  # list of tensors (rank-varying)
        self.optimizers = optimizers  # list of optimizer state_dicts
        self.schedulers = schedulers  # list of scheduler state_dicts
        self.small = small  # smallstate fields (RNG, data positions), bytes
        self.undiscovered = undiscovered  # sentences naming what the runtime could not see


class Runtime:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.job = env.get("LOCKSTEP_JOB", "job")
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.role = env.get("LOCKSTEP_ROLE", "worker")
        self.generation = int(env.get("LOCKSTEP_GENERATION", "0"))
        self.node_dir = env.get("LOCKSTEP_NODE_DIR")
        # The store the groups' next generations are built in, once the job's own store was lost
        # with its node (an orchestrator took over elsewhere): a ``rebuild`` order says where.
        self.store_addr = env.get("LOCKSTEP_STORE") or None
        self.step_no = 0
        self.first_grad_op_pending = True
        self.replaying = self.role == "replacement"
        self.phase = "ff" if self.replaying else "live"
        self.groups: dict[str, object] = {}
        self.ddps: list = []
        self.optimizers: list = []
        self.schedulers: list = []
        self.loaders: list = []
        # Live data-loader iterators, weakly: one the script drops (next(iter(loader)) each step)
        # leaves the set when it is garbage.
        self.proxies = weakref.WeakSet()
        self.rng = RngTracker()
        self.problems: list[str] = []
        self.inexact: list[str] = []
        self.controller = None  # control.Controller, attached by launch
        self._step_started = time.perf_counter()
        self.step_time_s = 0.0
        self._in_opt_step = False
        self.transfer_lock = threading.Lock()
        self._boundary_cv = threading.Condition()
        self._snapshots: dict[int, dict] = {}
        # A hold order and the step it applies to change under ``_boundary_cv``: the main
        # thread decides to hold and the controller answers an order against the same state,
        # so an order can never be half-seen (a rank holding at a step no order names).
        self.hold_at: int | None = None
        self._exit_at_hold = False
        self.holding = False
        self._boundary_actions: list = []
        self._writers = None
        self._records = None
        # The off-node copy (multi-node jobs, ``offnode``): the gate this rank's step waits at,
        # the word that wakes its supervisor's forwarder, and the buffers of the last ``post``
        # (a forward pass that changes them makes the gate wait for ``mid`` too).
        self._copy_gate = None
        self._written = None
        self._writes = 0
        self._post_step: int | None = None  # a worker's first boundary written is step 1's
        self._post_buffers = b""
        self._needs_mid = False
        self._buffer_cache = None
        self._modules_listed = 0
        self._library_roots = preimport.library_roots()
        # replacement
        self.plan = None  # replacement.Plan
        self.side_effects = SideEffects()
        self.batch_skeletons: dict[int, Skeleton] = {}
        self.output_skeletons: dict[tuple, Skeleton] = {}
        self.tainted = False
        self.live_after: dict[str, tuple | None] = {}
        self._original_stderr = sys.stderr
        self._fault = _parse_fault(env) if self.role == "worker" else None
        if self.node_dir:
            paths = smallstate.rank_paths(self.node_dir, self.rank)
            if self.role == "worker":
                self._writers = {kind: smallstate.SlotWriter(paths[kind]) for kind in smallstate.KINDS}
                self._records = smallstate.RecordWriter(paths["records"])
                self._watch_copy()

    # -- messages --------------------------------------------------------------------------

    def say(self, message: str):
        """One line on the rank's real stderr (also while a replacement swallows output)."""
        with contextlib.suppress(Exception):
            self._original_stderr.write(f"[lockstep rank {self.rank}] {message}\n")
            self._original_stderr.flush()

    def note_unprotected(self, reason: str):
        if reason not in self.problems:
            self.problems.append(reason)
            self.say(f"not protected from a hard failure: {reason}")
            if self.controller:
                self.controller.send({"op": "unprotected", "reason": reason})

    def note_inexact(self, what: str):
        self.inexact.append(what)

    def diverged(self, message: str):
        self.say(f"replacement diverged from the rank it replaces: {message}")
        if self.controller:
            self.controller.send({"op": "diverged", "message": message})
        self.controller_fail_now(f"replacement diverged: {message}")

    def controller_fail_now(self, message: str):
        sys.stderr = self._original_stderr
        raise RuntimeError(f"lockstep: {message}")

    # -- discovery -------------------------------------------------------------------------

    def register_ddp(self, ddp):
        self.ddps.append(ddp)
        self._buffer_cache = None

    def register_optimizer(self, opt):
        self.optimizers.append(opt)
        if type(opt).__name__ == "ZeroRedundancyOptimizer":
            self.note_unprotected("ZeroRedundancyOptimizer shards optimizer state: no rank holds a replica")

    def register_scheduler(self, sched):
        self.schedulers.append(sched)

    def register_loader(self, loader) -> int:
        lid = getattr(loader, "_lockstep_id", None)
        if lid is None:
            lid = len(self.loaders)
            loader._lockstep_id = lid
            loader._lockstep_iters = 0
            self.loaders.append(loader)
            for owner in (loader, getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None),
                          getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
                gen = getattr(owner, "generator", None)
                if isinstance(gen, torch.Generator) and all(gen is not g for g in self.rng.generators):
                    self.rng.generators.append(gen)
        return lid

    def parameters(self) -> list[torch.Tensor]:
        """Replicated tensors: the parameters of DDP models, then any other parameter an
        optimizer updates (a model the script all-reduces by hand)."""
        seen: set[int] = set()
        out = []
        for ddp in self.ddps:
            for p in ddp.module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def buffers(self) -> list[torch.Tensor]:
        if self._buffer_cache is None:
            self._buffer_cache = [b for ddp in self.ddps for b in ddp.module.buffers()]
        return self._buffer_cache

    def undiscovered(self) -> list[str]:
        notes = list(self.problems)
        if not self.ddps:
            notes.append("no DistributedDataParallel model was created: parameters are taken from the optimizers")
        if not self.optimizers:
            notes.append("no torch.optim optimizer was created: there is no step boundary")
        return notes

    # -- the small state -------------------------------------------------------------------

    def _buffers_blob(self) -> bytes:
        bufs = self.buffers()
        if not bufs:
            return b""
        return b"".join(b.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for b in bufs)

    def _set_buffers(self, blob: bytes):
        bufs = self.buffers()
        off = 0
        with torch.no_grad():
            for b in bufs:
                n = b.numel() * b.element_size()
                src = torch.frombuffer(bytearray(blob[off:off + n]), dtype=torch.uint8).view(b.dtype).reshape(b.shape)
                b.copy_(src)
                off += n
        if off != len(blob):
            raise RuntimeError(f"buffer layout differs: {len(blob)} bytes recorded, {off} expected")

    def positions(self) -> list[list[int]]:
        return sorted([p.loader_id, p.index, p.pos] for p in list(self.proxies) if not p.exhausted)

    def small_fields(self, kind: str) -> dict[str, bytes]:
        fields = self.rng.capture(include_slow=kind == "post")
        blob = self._buffers_blob()
        if blob:
            fields["buffers"] = blob
        if kind == "post":
            positions = self.positions()
            fields["data"] = _COMPACT_JSON.encode(positions).encode() if positions else b"[]"
        fields["meta"] = struct.pack("<q", self.step_no)
        return fields

    def _write_small(self, kind: str):
        if self._writers is None:
            return
        fields = self.small_fields(kind)
        self._writers[kind].write(self.step_no, smallstate.encode(fields))
        if self._written is not None and kind != "pre":
            if kind == "post":
                self._post_step = self.step_no
                self._post_buffers = fields.get("buffers", b"")
            else:
                self._needs_mid = fields.get("buffers", b"") != self._post_buffers
                if not self._needs_mid:
                    return  # the gate waits for post only: mid goes with the next batch
            self._writes += 1
            self._written.touch(self.rank, self._writes)

    def _watch_copy(self):
        if self._copy_gate is None:
            import atexit

            atexit.register(self._say_copy_summary)
        self._copy_gate = offnode.CopyGate(self.node_dir, self.rank, self.say)
        with contextlib.suppress(FileNotFoundError, ValueError):
            self._written = offnode.Written(self.node_dir, create=False)

    def _say_copy_summary(self):
        line = self._copy_gate.summary() if self._copy_gate is not None else None
        if line:
            self.say(line)

    def start_writing(self, inherited_records):
        """A replacement gone live writes the rank's small state from now on; its record file
        continues the lost rank's history (kept on this node already, or written afresh)."""
        if not self.node_dir:
            return
        paths = smallstate.rank_paths(self.node_dir, self.rank)
        fresh = not os.path.exists(paths["records"]) or os.path.getsize(paths["records"]) == 0
        self._writers = {kind: smallstate.SlotWriter(paths[kind]) for kind in smallstate.KINDS}
        self._records = smallstate.RecordWriter(paths["records"])
        self._watch_copy()
        if fresh:
            for meta, blob in inherited_records:
                self._records.append(meta, blob)
        self._write_small("post")

    def record(self, meta: dict, blob: bytes = b""):
        if self._records is not None:
            self._records.append(meta, blob)

    # -- fault injection (tests) -------------------------------------------------------------

    def fault_point(self, point: str, index: int = 0):
        """``LOCKSTEP_FAULT=rank:step:point[:index]`` makes that rank SIGKILL itself there, for
        tests that need a failure at an exact place (``grad:2`` = as the third gradient bucket
        of the step is handed to the group: in the middle of the backward pass)."""
        f = self._fault
        if f and f[0] == self.rank and f[1] == self.step_no and f[2] == point and f[3] == index:
            os.kill(os.getpid(), 9)

    # -- hooks -----------------------------------------------------------------------------

    def on_first_grad_op(self):
        """The first gradient bucket of a step is being reduced: the forward pass is over."""
        self.first_grad_op_pending = False
        if self.phase == "replay":
            self.plan.pin("mid", self.step_no, self)
        self._write_small("mid")
        if self._copy_gate is not None and self._post_step == self.step_no:
            # From here on the survivors can finish this step: not before the off-node copy
            # holds the boundary it started from (``offnode``: a lost node costs one step at most).
            self._copy_gate.wait(self.step_no, self._needs_mid)

    def _check_replicated(self, opt):
        """Sharded parameters (FSDP's flat parameters, DTensors) have no data-parallel replica:
        a replacement could not get its rank's shard from a survivor."""
        opt._lockstep_checked = True
        for group in opt.param_groups:
            for p in group["params"]:
                if getattr(p, "_is_flat_param", False) or type(p).__name__ == "DTensor" or \
                        type(getattr(p, "data", None)).__name__ == "DTensor":
                    self.note_unprotected("sharded parameters (FSDP / DTensor): no rank holds a replica of another's shard")
                    return

    def on_pre_step(self, opt):
        if not getattr(opt, "_lockstep_checked", False):
            self._check_replicated(opt)
        if self._fault:
            self.fault_point("pre")
        if self.phase == "replay":
            self.plan.pin("pre", self.step_no, self)
        self._write_small("pre")
        self.transfer_lock.acquire()
        self._in_opt_step = True

    def on_post_step(self, opt):
        self._in_opt_step = False
        self.transfer_lock.release()
        now = time.perf_counter()
        self.step_time_s = now - self._step_started
        self._step_started = now
        with self._boundary_cv:
            self.step_no += 1
            self.first_grad_op_pending = True
            self._snapshot_boundary()
            self._boundary_cv.notify_all()
        if self.replaying:
            self.plan.on_boundary(self)
        self._write_small("post")
        if self.step_no & 31 == 1 and self.node_dir and self.local_rank == 0 and self.phase == "live":
            self._list_libraries()
        if self._boundary_actions:
            actions, self._boundary_actions = self._boundary_actions, []
            for action in actions:
                action()
        self._hold_if_ordered()
        if self._fault:
            self.fault_point("post")

    def _list_libraries(self):
        """Tell the node's warm spares what to import while they wait (``preimport``): after the
        first step, and again every 32 steps while the script still imports more."""
        if len(sys.modules) == self._modules_listed:
            return
        self._modules_listed = len(sys.modules)
        with contextlib.suppress(OSError):
            preimport.write(self.node_dir, preimport.library_modules(sys.modules, self._library_roots))

    def _snapshot_boundary(self):
        snap = {
            "schedulers": [_copy_state(s.state_dict()) for s in self.schedulers],
            "param_groups": [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups]
                             for o in self.optimizers],
        }
        self._snapshots[self.step_no] = snap
        self._snapshots.pop(self.step_no - 3, None)

    def snapshot_at(self, step_no: int) -> dict | None:
        return self._snapshots.get(step_no)

    def wait_boundary(self, step_no: int, timeout: float) -> bool:
        """For a donor: block until this rank sits at boundary ``step_no`` (not past it)."""
        deadline = time.monotonic() + timeout
        with self._boundary_cv:
            while self.step_no < step_no:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._boundary_cv.wait(left)
        return self.step_no == step_no

    # -- orders ----------------------------------------------------------------------------

    def request_hold(self, boundary: int, exit_after: bool = False) -> str:
        """An order to hold at ``boundary``. Returns ``"missed"`` when this rank is past it (or
        parked at another step), ``"holding"`` when it is parked there already, else
        ``"ahead"`` (it will hold on reaching it; a rank parked at an earlier step runs on)."""
        with self._boundary_cv:
            if self.step_no > boundary or (self.step_no == boundary and not self.holding):
                return "missed"
            self.hold_at = boundary
            self._exit_at_hold = exit_after
            self._boundary_cv.notify_all()
            return "holding" if self.holding and self.step_no == boundary else "ahead"

    def release_hold(self):
        with self._boundary_cv:
            self.hold_at = None
            self._exit_at_hold = False
            self._boundary_cv.notify_all()

    def at_next_boundary(self, action):
        self._boundary_actions.append(action)

    def _must_hold(self) -> bool:
        return self.hold_at is not None and self.step_no >= self.hold_at

    def _hold_if_ordered(self):
        with self._boundary_cv:
            if not self._must_hold():
                return
            self.holding = True
            boundary = self.step_no
        if self.controller:
            self.controller.send({"op": "holding", "boundary": boundary})
        with self._boundary_cv:
            while self._must_hold() and not self._exit_at_hold:
                self._boundary_cv.wait()
            leave = self._must_hold() and self._exit_at_hold
            self.holding = False
        if leave:
            self.say(f"migrated away at step {boundary}; exiting")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

    def on_group_error(self, pg, generation: int, exc: BaseException):
        if self.controller:
            self.controller.send({"op": "group_error", "group": pg.group_id, "generation": generation,
                                  "error": str(exc).splitlines()[0][:300]})

    # -- what a replacement is served -------------------------------------------------------

    def replay_decision(self, group_id: str, key, grad: bool) -> str:
        if self.phase == "ff":
            return "phantom"
        live_after = self.live_after.get(group_id)
        if live_after is None or key > live_after:
            return "live"
        if grad:
            self.tainted = True
            return "phantom"
        return "log"

    def served_rebuild(self, group_id, n):
        return self.plan.logs(group_id).rebuild(n) if self.plan else None

    def served_result(self, group_id, key):
        return self.plan.logs(group_id).interval(key) if self.plan else None

    def served_permanent(self, group_id, key):
        return self.plan.logs(group_id).permanent(key) if self.plan else None

    # -- DDP forward while fast-forwarding -------------------------------------------------

    @property
    def ff_dummy(self) -> bool:
        return self.phase == "ff" and self.step_no >= REAL_STEPS

    def ddp_forward(self, ddp, real_forward, args, kwargs):
        if self.phase != "ff":
            return real_forward(*args, **kwargs)
        sig = signature(args, kwargs)
        skel = self.output_skeletons.get(sig)
        if self.ff_dummy and skel is not None:
            return skel.zeros(requires_grad=True)
        out = real_forward(*args, **kwargs)
        self.output_skeletons[sig] = Skeleton(out)
        return out

    # -- capture / load (replacements, snapshots) -------------------------------------------

    def capture_rank_state(self) -> RankState:
        """This rank's discovered state at the current boundary (call it at a boundary: from
        an ``at_next_boundary`` action or while holding). Tensors are references, not copies."""
        return RankState(
            step_no=self.step_no,
            parameters=self.parameters(),
            buffers=self.buffers(),
            optimizers=[o.state_dict() for o in self.optimizers],
            schedulers=[s.state_dict() for s in self.schedulers],
            small=self.small_fields("post"),
            undiscovered=self.undiscovered(),
        )

    def load_parameters(self, tensors):
        params = self.parameters()
        if len(tensors) != len(params):
            raise RuntimeError(f"{len(tensors)} parameters received, the model has {len(params)}")
        with torch.no_grad():
            for p, t in zip(params, tensors, strict=True):
                if p.shape != t.shape:
                    raise RuntimeError(f"parameter shape {tuple(t.shape)} received for {tuple(p.shape)}")
                p.copy_(t)

    def load_optimizer_states(self, states: list[dict], param_groups: list | None):
        if len(states) != len(self.optimizers):
            raise RuntimeError(f"{len(states)} optimizer states received, the script has {len(self.optimizers)}")
        for i, (opt, sd) in enumerate(zip(self.optimizers, states, strict=True)):
            if param_groups is not None:
                groups = []
                for mine, theirs in zip(sd["param_groups"], param_groups[i], strict=True):
                    g = dict(theirs)
                    g["params"] = mine["params"]
                    groups.append(g)
                sd = {"state": sd["state"], "param_groups": groups}
            opt.load_state_dict(sd)

    def load_schedulers(self, states: list[dict]):
        if len(states) != len(self.schedulers):
            raise RuntimeError(f"{len(states)} scheduler states received, the script has {len(self.schedulers)}")
        for sched, sd in zip(self.schedulers, states, strict=True):
            sched.load_state_dict(sd)

    def load_small(self, fields: dict[str, bytes], with_data: bool = True):
        if "buffers" in fields:
            self._set_buffers(fields["buffers"])
        self.rng.restore(fields)


def _parse_fault(env) -> tuple | None:
    spec = env.get("LOCKSTEP_FAULT")
    if not spec:
        return None
    parts = spec.split(":")
    return (int(parts[0]), int(parts[1]), parts[2], int(parts[3]) if len(parts) > 3 else 0)


def _copy_state(sd: dict) -> dict:
    # state_dict() returns the scheduler's own containers; step() rebinds them, but copy the
    # top-level lists and dicts so a later in-place change cannot reach the snapshot.
    return {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v) for k, v in sd.items()}


# Built once: json.dumps with separators builds an encoder per call (a third of a write's time).
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))

RUNTIME: Runtime | None = None


def excepthook_report(exc: BaseException):
    rt = RUNTIME
    if rt is not None:
        rt.say("".join(traceback.format_exception_only(type(exc), exc)).strip())


def hostname() -> str:
    return socket.gethostname()
