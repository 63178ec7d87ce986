"""TorchTitan (0.3): a ``CheckpointManager`` whose asynchronous saves go through lockstep.

Use it where the trainer builds its checkpointer::

    from lockstep.checkpoint.adapters.torchtitan import LockstepCheckpointManager
    config.checkpoint = LockstepCheckpointManager.Config(enable=True, async_mode="async", ...)

Everything else is TorchTitan's: the interval, ``keep_latest_k`` purging, the step folders,
loading (the files are DCP's format, so ``dcp_load`` reads them), the synchronous last-step and
HF exports. With ``async_mode`` "async" or "async_with_pinned_mem", ``dcp_save`` stages into
lockstep's shared arena; with ``overlap`` (the default) the copies run beside the next forward and
backward and TorchTitan's optimizer step waits for them, which is when TorchTitan already waits
for staging (``maybe_wait_for_staging`` right before ``optimizers.step()``).

A step folder appears only once its checkpoint is complete (atomic publish), so TorchTitan's
``keep_latest_k`` purge, which runs right after each save call, does not count the checkpoint
still being written and keeps one older complete one a save longer.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torchtitan.components.checkpoint import AsyncMode, CheckpointManager

from lockstep.checkpoint import Checkpointer, SaveHandle


class SaveFuture(Future):
    """A ``concurrent.futures.Future`` over a lockstep save (what TorchTitan waits on)."""

    def __init__(self, handle: SaveHandle):
        super().__init__()
        self.handle = handle

    def done(self) -> bool:
        return self.handle.done()

    def result(self, timeout: float | None = None) -> dict:
        return self.handle.wait(timeout)


class _NoStager:
    """Stands in for the DefaultStager TorchTitan would allocate (pinned buffers we do not use)."""

    def close(self) -> None:
        pass


class LockstepCheckpointManager(CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        overlap: bool = True
        """Let staging run beside the next forward/backward; the optimizer step waits for it."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        self.overlap = config.overlap
        self.lockstep = Checkpointer(process_group=self.pg)
        if self.async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            self.stager = _NoStager()

    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ):
        if async_mode == AsyncMode.DISABLED or to_hf:
            return super().dcp_save(state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf)
        handle = self.lockstep.save(state_dict, checkpoint_id, overwrite=True, overlap=self.overlap)
        future = SaveFuture(handle)
        if async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            staged: Future = Future()
            staged.set_result(None)  # the optimizer pre-step hook is the staging wait
            return AsyncSaveResponse(staging_completion=staged, upload_completion=future)
        return future

    def _close(self) -> None:
        super()._close()
        if getattr(self, "lockstep", None) is not None:
            self.lockstep.close()
