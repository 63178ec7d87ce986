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
searches, the element tables, and the route-class incidence of recent pair sets with the ECMP
columns of the elements asked for (a stable probe plan reuses them). Keep one per topology
(and drop it when the topology changes). A window that is already parsed
(`workers.fabric.observations.parse_observations`) can be passed as a Window.
`triangulate` raises ObservationsError (naming every bad key, name and row) on invalid input.

Evidence for a culprit (the affected pairs of an incident's heat map):

    rows, share = pairs_through(model, window, "link", "L12")   # window rows, fraction crossing
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workers.fabric.observations import ObservationsError, Window, parse_observations
from workers.fabric.paths import PathIndex
from workers.fabric.topology import Topology
from workers.triangulation.fabric import KIND_NAMES, FabricModel
from workers.triangulation.localize import VERDICT_FORMAT, Culprit, Settings, Verdict, localize

__all__ = ["VERDICT_FORMAT", "Culprit", "FabricModel", "ObservationsError", "Settings", "Verdict", "pairs_through",
           "triangulate"]


def triangulate(model: FabricModel | Topology | PathIndex, window: dict[str, Any] | Window,
                settings: Settings | None = None) -> Verdict:
    """Localize the faults of one observation window (see the module docstring)."""
    if not isinstance(model, FabricModel):
        model = FabricModel(model)
    if not isinstance(window, Window):
        window = parse_observations(window, model.index)
    return localize(model.prepare(window), settings or Settings())


def pairs_through(model: FabricModel, window: dict[str, Any] | Window, kind: str, name: str):
    """(rows, share): the window rows (indices into its `probes`) whose probes can cross the
    element, and the share of each row's probes that does (1 for its NICs and hosts and on a
    known path; the ECMP share otherwise). Raises KeyError for an unknown element."""
    if not isinstance(window, Window):
        window = parse_observations(window, model.index)
    idx = model.index
    k = KIND_NAMES.index(kind)
    t = (idx.link_index, idx.switch_index, idx.nic_index, idx.host_index)[k][name]
    if k == 0:
        elements = [2 * t, 2 * t + 1]
    elif k == 1:
        elements = [2 * model.n_links + t]
    elif k == 2:
        elements = [model.nic_tx0 + t, model.nic_rx0 + t]
    else:
        elements = [model.host_tx0 + t, model.host_rx0 + t]
    prep = model.prepare(window)
    cols = prep.columns(np.array(elements, dtype=np.int64))
    full = prep.restrict(cols, np.arange(prep.n)).tocsr()
    share = np.asarray(full.max(axis=1).todense()).ravel()
    hit = np.flatnonzero(share > 0)
    return prep.rows[hit], share[hit]
