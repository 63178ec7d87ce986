"""The fabric map of a cluster page: its drawing (cached per imported topology) and the health
the page polls for, summarized per bundle when the drawing is aggregated."""

from __future__ import annotations

import threading
from collections import OrderedDict

from console.fleet.models import Cluster
from console.fleet.status import cluster_status
from console.fleet.topology_io import export_topology
from workers.fabric.layout import Layout, layout, summarize_health
from workers.fabric.topology import parse_topology

CACHE_SIZE = 8
# Unhealthy members a bundle's details list (the rest are counted).
BUNDLE_BAD_SHOWN = 8

_cache: OrderedDict[tuple, Layout] = OrderedDict()
_lock = threading.Lock()


def cluster_map(cluster: Cluster) -> Layout | None:
    """The drawing of the cluster's imported topology, or None before an import.

    A layout depends only on the imported document, so it is computed once per import (the
    9,216-GPU fabric takes about half a second to export, parse and lay out)."""
    if cluster.topology_imported_at is None:
        return None
    key = (cluster.pk, cluster.topology_imported_at)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    topology = parse_topology(export_topology(cluster))
    drawing = layout(topology) if topology.hosts or topology.switches else None
    with _lock:
        _cache[key] = drawing
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return drawing


def map_status(cluster: Cluster, drawing: Layout | None) -> dict:
    """`cluster_status`, with links and NICs replaced by per-bundle health for an aggregated map."""
    status = cluster_status(cluster)
    status["aggregated"] = bool(drawing and drawing.aggregated)
    if not status["aggregated"]:
        return status
    link_health = {row["name"]: row["health"] for row in status.pop("links")}
    nic_health = {row["name"]: row["health"] for row in status.pop("nics")}
    bundles = []
    for bundle in drawing.bundles:
        cables = [(name, link_health.get(name, "unknown")) for name in bundle["links"]]
        nics = [(name, nic_health.get(name, "unknown")) for name in bundle["nics"]]
        # One color for cables and the NICs at their ends (a NIC down is a path down), counted apart.
        health, _ = summarize_health(h for _, h in cables + nics)
        bad = [name for name, h in cables + nics if h in ("down", "degraded")]
        bundles.append({"name": bundle["id"], "health": health, "counts": summarize_health(h for _, h in cables)[1],
                        "nic_counts": summarize_health(h for _, h in nics)[1], "bad": bad[:BUNDLE_BAD_SHOWN],
                        "bad_total": len(bad)})
    status["bundles"] = bundles
    return status
