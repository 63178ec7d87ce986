"""The runtime injected into every training process by ``lockstep run``.

Entry point: ``python -m lockstep.runtime.launch SCRIPT ARGS`` (see ``launch``). The pieces:
``group`` (the process group that survives a lost member), ``patches`` (the hooks into
PyTorch), ``context`` (the per-process runtime: step clock, orders, capture/load), ``smallstate``
and ``rng`` (the per-rank state kept off the rank), ``replay`` and ``replacement`` (how a
replacement catches up), ``spare`` and ``preimport`` (the warm processes replacements start from,
with the libraries the node's workers imported already imported), ``control`` and ``transfer``
(its connections).
"""
