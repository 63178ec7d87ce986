"""DeepSpeed (0.19): a checkpoint engine that writes DeepSpeed's own files in the background.

Install it on an engine after ``deepspeed.initialize``::

    from lockstep.checkpoint.adapters.deepspeed import LockstepCheckpointEngine
    engine.checkpoint_engine = LockstepCheckpointEngine()
    engine.save_checkpoint(save_dir, tag)        # returns at once

The files are DeepSpeed's (``mp_rank_*_model_states.pt``, ``*_optim_states.pt``, written with
``torch.save``), so ``load_checkpoint`` and DeepSpeed's tools read them as always. It is a
*decoupled* engine in DeepSpeed's sense: ``save_checkpoint`` only records what to save; at the
next optimizer boundary (``engine.step()``, before the weights change) every file of the tag is
staged in one capture, and the worker writes them. DeepSpeed writes ``latest`` only once every
rank's files are published (the ranks agree on it with one small all-reduce per step while a
checkpoint is pending), so ``latest`` never names an incomplete checkpoint.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from lockstep.capture.engine import CaptureHandle, Engine
from lockstep.checkpoint.files import save_files


class LockstepCheckpointEngine(CheckpointEngine):
    def __init__(self, config_params=None, engine: Engine | None = None):
        super().__init__(config_params)
        self.name = "LockstepCheckpointEngine"
        self.engine = engine or Engine(name="lockstep-deepspeed")
        self.engine.start()
        self._files: list = []
        self._info: CheckpointCommitInfo | None = None
        self._handle: CaptureHandle | None = None
        self._group = None
        self.last_stall_s = 0.0

    # -- DeepSpeed's interface -------------------------------------------------------------------

    def create(self, info: CheckpointCommitInfo):
        if self._info is not None:
            # One checkpoint in flight: the previous must be published first, and DeepSpeed
            # will not get to commit it, so name it ``latest`` here as it would have.
            previous = self._info
            self._drain()
            if previous.save_latest and (not dist.is_initialized() or dist.get_rank() == 0):
                with open(os.path.join(previous.save_dir, "latest"), "w") as f:
                    f.write(previous.tag)
        self._info = info
        self._files = []

    def save(self, state_dict, path: str):
        self._files.append((path, state_dict))  # staged at the next optimizer boundary

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo):
        return True  # only ever called with what get_commit_info returned: already published

    def is_decoupled(self):
        return True

    def preserves_storage_sharing(self):
        return False  # every tensor is staged on its own: DeepSpeed need not clone them first

    def get_commit_info(self):
        """Called by DeepSpeed at every optimizer boundary, right before the weights change."""
        if self._info is None:
            return None
        if self._files:
            self._stage()
            return None
        if not self._all_ranks_published():
            return None
        self._handle.wait()
        info, self._info, self._handle = self._info, None, None
        return info

    def cleanup(self):
        if self._info is not None:
            self._drain()
        self.engine.close()

    # -- internals -------------------------------------------------------------------------------

    def _stage(self) -> None:
        handle = save_files(self.engine, self._files)
        self.last_stall_s = handle.staged_s
        self._handle, self._files = handle, []

    def _all_ranks_published(self) -> bool:
        done = self._handle is None or self._handle.done()
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return done
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
        flag = torch.tensor([1 if done else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        return bool(flag.item())

    def _drain(self) -> None:
        if self._files:
            self._stage()
        if self._handle is not None:
            self._handle.wait()
        self._handle = None
