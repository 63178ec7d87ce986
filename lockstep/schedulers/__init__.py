"""Where replacements come from: one interface, one plugin per kind of cluster.

A plugin is a class with a ``name`` and, given the job's orchestrator at construction:

``spare_count() -> int``
    How many replacements it can start now (for ``lockstep jobs`` and the refusal message).

``async start_replacement(*, rank, generation, incarnation, lost_node) -> dict``
    Take a spare and start, on it, the script as rank ``rank`` in replacement mode for group
    generation ``generation`` (the process's ``LOCKSTEP_INCARNATION`` is ``incarnation``; the
    replacement then connects to the orchestrator by itself). ``lost_node`` is the node the lost
    rank ran on (None when unknown): a plugin may prefer it (local data, same GPU type) or avoid
    it (a failing node). Returns ``{"node": ..., "pid": ..., "host": ...}``; raises ``NoSpare``
    when there is none, with a sentence saying why.

``describe() -> dict``
    What it manages, for ``lockstep jobs``.

Plugins: ``local`` (warm spare processes kept by each node's ``lockstep run``), ``slurm`` (a
spare node of the job's allocation, started with ``srun``), ``kubernetes`` (a spare pod, Kubeflow
PyTorchJob aware, through the official client). Register another with ``register``.
"""

from __future__ import annotations

from lockstep.orchestrator.core import Unrecoverable


class NoSpare(Unrecoverable):
    """No spare is left (the job then fails as it would under torchrun)."""


_PLUGINS: dict[str, str] = {
    "local": "lockstep.schedulers.local:LocalScheduler",
    "slurm": "lockstep.schedulers.slurm:SlurmScheduler",
    "kubernetes": "lockstep.schedulers.kubernetes:KubernetesScheduler",
}


def register(name: str, target: str):
    """``target``: ``"module:Class"``."""
    _PLUGINS[name] = target


def names() -> list[str]:
    return sorted(_PLUGINS)


def get_scheduler(name: str, orchestrator):
    import importlib

    try:
        target = _PLUGINS[name]
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}: choose one of {', '.join(names())}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(orchestrator)
