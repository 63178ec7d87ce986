"""How a replacement re-runs a script's control flow without re-doing its work.

A replacement for rank R starts the unmodified script from the top, as rank R (so everything the
script builds from its rank -- shards, seeds, samplers -- is R's), and must arrive at the step
boundary where the job is without spending the job's compute again. It does so in three phases:

* **fast-forward, real** (the first ``REAL_STEPS`` optimizer steps): everything runs, collectives
  are completed locally (from the group's logs where the value matters: interval 0 and DDP's
  bucket rebuild). DDP's reducer goes through its first iterations exactly as it did on the
  original rank, and the replacement learns what a batch and a forward output look like.
* **fast-forward, dummy**: data-loader iterators hand out zero batches of the learned structure
  without touching the dataset, the DDP forward returns zero outputs of the learned structure
  (leaves that require grad, so ``loss.backward()`` runs and no parameter gets a gradient;
  optimizers then skip every parameter). The loop's counters, the schedulers and the iterators
  advance as they did on the original rank, at a fraction of a millisecond per step.
* **resume**: at the boundary, parameters and optimizer state come from a data-parallel replica,
  the rank's RNG/buffers/data positions from its replica off the rank, the live data-loader
  iterators are rebuilt at their positions, and the replacement joins the group.

While fast-forwarding the script must not do again what the original rank already did: output
to stdout/stderr and logging is swallowed, ``torch.save`` and files opened for writing go
nowhere. Value-dependent control flow on dummy values (early stopping on a loss threshold) is
the limit of this approach; the resume checks the positions it reached against the original's
and refuses to continue on a mismatch.
"""

from __future__ import annotations

import builtins
import io
import logging
import os
import sys
import traceback

import torch
from torch.utils import _pytree as pytree

REAL_STEPS = 2


class Skeleton:
    """The structure of a batch or a forward output: a pytree spec with (shape, dtype) leaves."""

    __slots__ = ("spec", "leaves")

    def __init__(self, tree):
        leaves, self.spec = pytree.tree_flatten(tree)
        self.leaves = [(tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else ("value", x)
                       for x in leaves]

    def zeros(self, requires_grad: bool = False):
        out = []
        for leaf in self.leaves:
            if leaf[0] == "value":
                out.append(leaf[1])
                continue
            shape, dtype, device = leaf
            t = torch.zeros(shape, dtype=dtype, device=device)
            if requires_grad and (dtype.is_floating_point or dtype.is_complex):
                t.requires_grad_(True)
            out.append(t)
        return pytree.tree_unflatten(out, self.spec)


def signature(args, kwargs) -> tuple:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (str(spec),) + tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else repr(x)[:64] for x in leaves)


class _NullText(io.TextIOBase):
    def write(self, s):
        return len(s)

    def writable(self):
        return True


class _StacklessTraceback:
    """``traceback`` as torch's device modules see it while a replacement fast-forwards.

    torch records the caller's stack for every device seed it defers (``torch.manual_seed``
    before CUDA, XPU or MTIA is initialized -- on a GPU host XPU and MTIA always are not): three
    ``format_stack`` calls per seed, a third of a fast-forward step of a script that seeds every
    step (py-spy of a replacement, 2026-12-04). The seeds are still deferred as before; only the
    stacks, printed if deferred seeding fails later, are not recorded."""

    def __getattr__(self, name):
        return getattr(traceback, name)

    @staticmethod
    def format_stack(*args, **kwargs):
        return ["  (stack not recorded while Lockstep fast-forwarded)\n"]


DEFERRED_SEED_MODULES = ("torch.cuda", "torch.xpu", "torch.mtia")


class SideEffects:
    """Swallows what a fast-forwarding replacement would otherwise repeat."""

    def __init__(self):
        self.active = False
        self._saved = None
        self._tracebacks: dict[str, object] = {}

    def suppress(self):
        if self.active:
            return
        real_open = builtins.open

        def quiet_open(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+") and not (isinstance(file, int)):
                return real_open(os.devnull, mode, *args, **kwargs)
            return real_open(file, mode, *args, **kwargs)

        self._saved = (sys.stdout, sys.stderr, real_open, io.open, torch.save, logging.root.manager.disable)
        sys.stdout = _NullText()
        sys.stderr = _NullText()
        builtins.open = quiet_open
        io.open = quiet_open
        torch.save = lambda *a, **k: None
        logging.disable(logging.CRITICAL)
        for name in DEFERRED_SEED_MODULES:
            mod = sys.modules.get(name)
            if mod is not None and getattr(mod, "traceback", None) is traceback:
                self._tracebacks[name] = mod.traceback
                mod.traceback = _StacklessTraceback()
        self.active = True

    def restore(self):
        if not self.active:
            return
        stdout, stderr, real_open, real_io_open, real_save, disabled = self._saved
        sys.stdout, sys.stderr = stdout, stderr
        builtins.open = real_open
        io.open = real_io_open
        torch.save = real_save
        logging.disable(disabled)
        for name, real in self._tracebacks.items():
            sys.modules[name].traceback = real
        self._tracebacks.clear()
        self.active = False
