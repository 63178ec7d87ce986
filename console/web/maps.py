"""The fabric map of a cluster page: its drawing (cached per imported topology) and the health
the page polls for, summarized per bundle when the drawing is aggregated."""

from __future__ import annotations

import threading
from collections import OrderedDict

from django.db.models import F
from django.db.models.functions import Coalesce

from console.fleet.models import Cluster, Link, Nic, Node, Switch
from console.fleet.status import cluster_status
from workers.fabric.layout import Layout, layout, summarize_health
from workers.fabric.topology import FORMAT, parse_topology

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
    topology = parse_topology(declared_topology(cluster))
    drawing = layout(topology) if topology.hosts or topology.switches else None
    with _lock:
        _cache[key] = drawing
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return drawing


def declared_topology(cluster: Cluster) -> dict:
    """The cluster's declared fabric as a `lockstep.topology/v1` document: the same as
    `export_topology`, read as plain rows (about ten times faster on 24k links than model
    instances, which matters for the first view of a large cluster)."""
    order = ("position", "name")
    return {
        "format": FORMAT,
        "name": cluster.topology_name or cluster.name,
        "hosts": [{"name": name} for name in Node.objects.filter(cluster=cluster, in_topology=True)
                  .order_by(*order).values_list("name", flat=True)],
        "switches": [{"name": name, "tier": tier} for name, tier in Switch.objects.filter(cluster=cluster)
                     .order_by(*order).values_list("name", "tier")],
        "nics": [{"name": name, "host": host} | ({"rail": rail} if rail is not None else {})
                 for name, host, rail in Nic.objects.filter(cluster=cluster, in_topology=True)
                 .order_by(*order).values_list("name", "node__name", "rail")],
        "links": [{"id": name, "a": a, "b": b} for name, a, b in Link.objects.filter(cluster=cluster)
                  .order_by(*order)
                  .values_list("name", Coalesce(F("a_nic__name"), F("a_switch__name")),
                               Coalesce(F("b_nic__name"), F("b_switch__name")))],
    }


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
        members = [(name, link_health.get(name, "unknown")) for name in bundle["links"]]
        members += [(name, nic_health.get(name, "unknown")) for name in bundle["nics"]]
        health, counts = summarize_health(h for _, h in members)
        bad = [name for name, h in members if h in ("down", "degraded")]
        bundles.append({"name": bundle["id"], "health": health, "counts": counts, "bad": bad[:BUNDLE_BAD_SHOWN],
                        "bad_total": len(bad)})
    status["bundles"] = bundles
    return status
