"""A cluster's health at a glance: what the live map draws, and what browsers poll for when
their websocket is down."""

from __future__ import annotations

from django.utils import timezone

from console.fleet.models import NODE_STATE_HEALTH, Cluster, Link, Nic, Node, Switch


def cluster_status(cluster: Cluster) -> dict:
    nodes = Node.objects.filter(cluster=cluster).values("id", "name", "state", "last_seen")
    return {
        "cluster": cluster.pk,
        "generated_at": timezone.now().isoformat(),
        "nodes": [
            {"id": n["id"], "name": n["name"], "state": n["state"], "health": NODE_STATE_HEALTH[n["state"]],
             "last_seen": n["last_seen"].isoformat() if n["last_seen"] else None}
            for n in nodes
        ],
        "switches": list(Switch.objects.filter(cluster=cluster).values("id", "name", "health")),
        "nics": list(Nic.objects.filter(cluster=cluster, in_topology=True).values("id", "name", "health")),
        "links": list(Link.objects.filter(cluster=cluster).values("id", "name", "health")),
    }
