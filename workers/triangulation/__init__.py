"""Fault triangulation: a topology and one probe window in, a `lockstep.verdict/v1` out.

Pure (no I/O, no clock). The method is in `localize` (three likelihood channels, a sparse
search over all links, switches, NICs and hosts, grouping to the smallest common element,
confidences from the likelihood); the element columns in `fabric`; the search engine in `glm`.

API (what the console's Celery task calls):

    model = FabricModel(topology)            # or FabricModel(path_index); once per topology
    verdict = triangulate(model, window_doc) # window_doc: a lockstep.observations/v1 dict
    verdict.to_document()                    # the lockstep.verdict/v1 dict
    verdict.network_ok, verdict.culprits     # Culprit(kind, name, confidence, evidence)

`FabricModel` caches, across windows of the same topology: the PathIndex and its breadth-first
searches, the element tables and the route-class incidence of recent pair sets (a stable probe
plan reuses it). Keep one per topology (and drop it when the topology changes). A window that
is already parsed (`workers.fabric.observations.parse_observations`) can be passed as a Window.
`triangulate` raises ObservationsError (naming every bad key, name and row) on invalid input.
"""

from __future__ import annotations

from typing import Any

from workers.fabric.observations import ObservationsError, Window, parse_observations
from workers.fabric.paths import PathIndex
from workers.fabric.topology import Topology
from workers.triangulation.fabric import FabricModel
from workers.triangulation.localize import VERDICT_FORMAT, Culprit, Settings, Verdict, localize

__all__ = ["VERDICT_FORMAT", "Culprit", "FabricModel", "ObservationsError", "Settings", "Verdict", "triangulate"]


def triangulate(model: FabricModel | Topology | PathIndex, window: dict[str, Any] | Window,
                settings: Settings | None = None) -> Verdict:
    """Localize the faults of one observation window (see the module docstring)."""
    if not isinstance(model, FabricModel):
        model = FabricModel(model)
    if not isinstance(window, Window):
        window = parse_observations(window, model.index)
    return localize(model.prepare(window), settings or Settings())
