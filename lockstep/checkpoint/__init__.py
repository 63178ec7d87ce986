"""Asynchronous application checkpoints: ``lockstep.checkpoint.save(state_dict, path)``.

``save`` returns once the state is staged in shared memory (the training loop may change it
right away); a background process writes it in PyTorch DCP's format and publishes it
atomically. ``load`` (or ``torch.distributed.checkpoint.load``) reads it back::

    import lockstep.checkpoint as ckpt

    handle = ckpt.save({"model": model, "optim": optim, "step": step}, f"ckpt/step-{step}")
    ...                         # keep training
    handle.wait()               # published (optional: the next save waits for it anyway)
    ckpt.load(state, ckpt.latest("ckpt"))
"""

from lockstep.checkpoint.checkpointer import (
    CaptureFailed,
    CaptureInFlight,
    Checkpointer,
    SaveHandle,
    default_checkpointer,
    is_complete,
    latest,
    load,
    save,
    wait,
)

__all__ = [
    "CaptureFailed",
    "CaptureInFlight",
    "Checkpointer",
    "SaveHandle",
    "default_checkpointer",
    "is_complete",
    "latest",
    "load",
    "save",
    "wait",
]
