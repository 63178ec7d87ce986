"""Adapters that route a training framework's asynchronous checkpoints through lockstep.checkpoint.

Each adapter imports its framework only when used; none is imported by ``lockstep.checkpoint``.

- :mod:`.torchtitan`: ``LockstepCheckpointManager`` for TorchTitan 0.3 (``CheckpointManager``)
- :mod:`.deepspeed`: ``LockstepCheckpointEngine`` for DeepSpeed 0.19 (``checkpoint_engine``)

Megatron-Core (``dist_checkpointing``'s async save) has no adapter yet.
"""
