"""Adapters that route a training framework's asynchronous checkpoints through lockstep.checkpoint.

Each adapter imports its framework only when used; none is imported by ``lockstep.checkpoint``.

- :mod:`.torchtitan`: ``LockstepCheckpointManager`` for TorchTitan 0.3 (``CheckpointManager``)
- :mod:`.deepspeed`: ``LockstepCheckpointEngine`` for DeepSpeed 0.19 (``checkpoint_engine``)
- :mod:`.megatron`: ``LockstepSaveStrategy`` for Megatron-Core 0.16 (``dist_checkpointing``'s
  sharded save strategy, ``torch_dist`` format, sync and async)
"""
