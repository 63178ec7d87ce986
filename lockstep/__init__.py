"""Lockstep: keep distributed training jobs running through rank failures, with no change to the
training script.

What users type: ``lockstep run -- torchrun ...`` (``lockstep.cli``). What runs inside every
training process: ``lockstep.runtime`` (started as ``python -m lockstep.runtime.launch``). One
orchestrator per job: ``lockstep.orchestrator``; where spare capacity comes from:
``lockstep.schedulers``. Importing this package imports nothing else (no torch, no console).
"""

__version__ = "0.1.0"
