"""The hooks the runtime puts into PyTorch, all installed by ``install(runtime)`` before the
script runs. Each one is the narrowest public or semi-public seam that sees what it must:

* ``init_process_group`` / ``new_group``: the group is created through a registered c10d
  backend plugin (``Backend.register_backend``) that returns a ``ResilientProcessGroup``
  wrapping the backend the script asked for; ``get_backend`` reports the inner name.
* ``DistributedDataParallel.__init__`` / ``.forward``: models are registered; a fast-forwarding
  replacement's forward returns zero outputs (``replay``).
* ``torch.distributed.Reducer``: a subclass whose ``_rebuild_buckets`` marks the broadcasts DDP
  issues when it rebuilds its buckets, so they are logged and replayed as rank 0 sent them.
* global optimizer step pre/post hooks (``torch.optim.optimizer.register_optimizer_step_*``):
  the step boundary; ``Optimizer.__init__`` / ``LRScheduler.__init__`` register instances.
* ``DataLoader.__iter__``: each iterator is wrapped in an ``IterProxy`` that counts its position
  (and, in a replacement, hands out dummy batches or a real iterator rebuilt at a position).
"""

from __future__ import annotations

import contextlib
import functools
import json
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader

from lockstep.runtime import smallstate
from lockstep.runtime.group import ResilientProcessGroup, tagged
from lockstep.runtime.replay import Skeleton

BACKEND = "lockstep"
_INSTALLED = False


def _inner_backend_for(requested) -> str:
    name = str(requested).lower() if requested else ""
    if name in ("", "none", "undefined"):
        return "nccl" if torch.cuda.is_available() else "gloo"
    if "nccl" in name:
        return "nccl"
    return "gloo"


def _backend_factory(rt, store, rank, size, timeout, inner_name, group_id):
    def build(generation: int):
        base = store
        if rt.store_addr:
            # The job's store was lost with its node; every member builds here from now on.
            host, port = rt.store_addr.rsplit(":", 1)
            base = dist.TCPStore(host, int(port), None, False, timeout=timeout)
        elif generation:
            # A connection of its own: a superseded generation's build may still be blocked in
            # the store waiting for a member that died, and a store client serves one call at a time.
            with contextlib.suppress(RuntimeError, NotImplementedError):
                base = store.clone()
        gstore = dist.PrefixStore(f"lockstep/{group_id}/gen{generation}/", base)
        if inner_name == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            return dist.ProcessGroupNCCL(gstore, rank, size, opts)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        # Gloo's default two threads, as in a plain job (group.py: ops may finish out of order).
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
        return dist.ProcessGroupGloo(gstore, rank, size, opts)

    return build


class IterProxy:
    """A DataLoader iterator, counted. ``pos`` is the number of batches handed out."""

    __slots__ = ("loader", "loader_id", "index", "pos", "exhausted", "_it", "_mode", "_length", "_rt", "__weakref__")

    def __init__(self, loader, rt):
        self._rt = rt
        self.loader = loader
        self.loader_id = rt.register_loader(loader)
        self.index = loader._lockstep_iters
        loader._lockstep_iters += 1
        self.pos = 0
        self.exhausted = False
        self._it = None
        self._length = None
        rt.proxies.add(self)
        if rt.phase == "live":
            self._mode = "live"
            rt.record({"ev": "iter", "loader": self.loader_id, "index": self.index, "step": rt.step_no},
                      smallstate.encode(rt.rng.capture()))
            self._it = _ORIG_ITER(loader)
        else:
            self._mode = "ff"
            self._length = rt.plan.iterator_length(self.loader_id, self.index)
            if not rt.ff_dummy:
                self._it = _ORIG_ITER(loader)

    def __iter__(self):
        return self

    def __next__(self):
        if self._mode == "live":
            try:
                batch = next(self._it)
            except StopIteration:
                self._finish()
                raise
            self.pos += 1
            return batch
        return self._next_ff()

    def _finish(self):
        self.exhausted = True
        rt = self._rt
        rt.proxies.discard(self)
        if self._mode == "live" and rt.phase == "live":
            rt.record({"ev": "end", "loader": self.loader_id, "index": self.index, "length": self.pos})

    def _next_ff(self):
        rt = self._rt
        if self._length is None:
            # Learned late in a proactive migration: the rank being replaced is still training.
            self._length = rt.plan.iterator_length(self.loader_id, self.index)
        if self._length is not None and self.pos >= self._length:
            self._finish()
            raise StopIteration
        skel = rt.batch_skeletons.get(self.loader_id)
        if rt.ff_dummy and skel is not None:
            self.pos += 1
            return skel.zeros()
        if self._it is None:
            self._it = _ORIG_ITER(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:
            self._finish()
            raise
        rt.batch_skeletons[self.loader_id] = Skeleton(batch)
        self.pos += 1
        return batch

    def go_live(self, creation_bundle: bytes | None, position: int):
        """Replace the stand-in with a real iterator at ``position`` (a replacement's resume)."""
        rt = self._rt
        if creation_bundle is not None:
            rt.rng.restore(smallstate.decode(creation_bundle))
        self._it = make_iterator_at(self.loader, position)
        self.pos = position
        self._mode = "live"

    def __len__(self):
        return len(self._it) if self._it is not None else len(self.loader)

    def __getattr__(self, name):
        it = object.__getattribute__(self, "_it")
        if it is None:
            raise AttributeError(name)
        return getattr(it, name)


class _SkipOnce:
    """A sampler whose first iteration starts ``skip`` items in (a resumed epoch)."""

    def __init__(self, inner, skip: int):
        self.inner = inner
        self.skip = skip

    def __iter__(self):
        it = iter(self.inner)
        if self.skip:
            n, self.skip = self.skip, 0
            for _ in range(n):
                next(it)
        yield from it

    def __len__(self):
        return len(self.inner)


def make_iterator_at(loader, position: int):
    """An iterator of ``loader`` that has already handed out ``position`` batches, with the
    sampler advanced without reading data. Worker processes (``num_workers > 0``) seed their
    RNGs per epoch and advance them per sample, and an IterableDataset has no index to skip:
    those iterators read and drop the batches, so what follows is what the original produced."""
    from torch.utils.data.dataloader import _DatasetKind

    if position == 0:
        return _ORIG_ITER(loader)
    if loader.num_workers > 0 or loader._dataset_kind == _DatasetKind.Iterable:
        it = _ORIG_ITER(loader)
        for _ in range(position):
            next(it)
        return it
    attr = "batch_sampler" if loader._auto_collation else "sampler"
    inner = getattr(loader, attr)
    object.__setattr__(loader, attr, _SkipOnce(inner, position))
    try:
        it = _ORIG_ITER(loader)
    finally:
        object.__setattr__(loader, attr, inner)
    it._num_yielded = position
    return it


def _lockstep_reducer_class():
    class LockstepReducer(dist.Reducer):
        """DDP's reducer; the bucket rebuild's broadcasts are tagged (see group.tagged)."""

        def _rebuild_buckets(self):
            with tagged("ddp-rebuild"):
                return super()._rebuild_buckets()

    return LockstepReducer


_ORIG_ITER = DataLoader.__iter__


def install(rt):
    """Install every hook for ``rt`` (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True

    group_counter = [0]

    def create_group(opts, backend_options):
        gid = "default" if group_counter[0] == 0 else f"g{group_counter[0]}"
        group_counter[0] += 1
        inner_name = _REQUESTED.get("backend", "gloo")
        timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(minutes=30)
        factory = _backend_factory(rt, opts.store, opts.group_rank, opts.group_size, timeout, inner_name, gid)
        pg = ResilientProcessGroup(rank=opts.group_rank, size=opts.group_size, group_id=gid, runtime=rt,
                                   backend_factory=factory, inner_name=inner_name, timeout=timeout,
                                   generation=rt.plan.generation if rt.plan is not None else rt.generation,
                                   build_now=rt.phase != "ff")
        rt.groups[gid] = pg
        return pg

    dist.Backend.register_backend(BACKEND, create_group, extended_api=True, devices=["cpu", "cuda"])
    _REQUESTED = {}

    orig_init = c10d.init_process_group

    @functools.wraps(orig_init)
    def init_process_group(backend=None, *args, **kwargs):
        _REQUESTED["backend"] = _inner_backend_for(backend)
        return orig_init(BACKEND, *args, **kwargs)

    orig_new_group = c10d.new_group

    @functools.wraps(orig_new_group)
    def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
        if backend is not None:
            _REQUESTED["backend"] = _inner_backend_for(backend)
        return orig_new_group(ranks, timeout, BACKEND, *args, **kwargs)

    orig_get_backend = c10d.get_backend

    @functools.wraps(orig_get_backend)
    def get_backend(group=None):
        pg = group if group is not None else c10d._get_default_group()
        if isinstance(pg, ResilientProcessGroup):
            return pg.inner_name
        return orig_get_backend(group)

    for mod in (c10d, dist):
        mod.init_process_group = init_process_group
        mod.new_group = new_group
        mod.get_backend = get_backend
    dist.Reducer = _lockstep_reducer_class()

    orig_ddp_init = DistributedDataParallel.__init__

    @functools.wraps(orig_ddp_init)
    def ddp_init(self, *args, **kwargs):
        orig_ddp_init(self, *args, **kwargs)
        rt.register_ddp(self)

    orig_forward = DistributedDataParallel.forward

    @functools.wraps(orig_forward)
    def ddp_forward(self, *args, **kwargs):
        if rt.phase != "ff":
            return orig_forward(self, *args, **kwargs)
        return rt.ddp_forward(self, functools.partial(orig_forward, self), args, kwargs)

    DistributedDataParallel.__init__ = ddp_init
    DistributedDataParallel.forward = ddp_forward

    orig_opt_init = Optimizer.__init__

    @functools.wraps(orig_opt_init)
    def opt_init(self, *args, **kwargs):
        orig_opt_init(self, *args, **kwargs)
        rt.register_optimizer(self)

    Optimizer.__init__ = opt_init
    register_optimizer_step_pre_hook(lambda opt, a, k: rt.on_pre_step(opt))
    register_optimizer_step_post_hook(lambda opt, a, k: rt.on_post_step(opt))

    orig_sched_init = LRScheduler.__init__

    @functools.wraps(orig_sched_init)
    def sched_init(self, *args, **kwargs):
        orig_sched_init(self, *args, **kwargs)
        rt.register_scheduler(self)

    LRScheduler.__init__ = sched_init
    # These three build themselves without calling LRScheduler.__init__.
    from torch.optim.lr_scheduler import ChainedScheduler, ReduceLROnPlateau, SequentialLR

    for cls in (ReduceLROnPlateau, SequentialLR, ChainedScheduler):
        cls.__init__ = _registering_init(cls.__init__, rt)

    def loader_iter(self):
        return IterProxy(self, rt)

    DataLoader.__iter__ = loader_iter


def _registering_init(orig, rt):
    @functools.wraps(orig)
    def init(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if all(self is not s for s in rt.schedulers):
            rt.register_scheduler(self)

    return init


def positions_from(fields: dict[str, bytes]) -> list[list[int]]:
    return json.loads(fields.get("data", b"[]"))
