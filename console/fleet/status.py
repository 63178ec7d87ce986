"""A cluster's health at a glance: what the live map draws, and what browsers poll for when
their websocket is down."""

from __future__ import annotations

from django.utils import timezone

from console.fleet.models import NODE_STATE_HEALTH, Cluster, Link, Nic, Node, Switch


def cluster_status(cluster: Cluster) -> dict:
    from console.incidents.services import open_incident_health, open_incidents, worse

    nodes = Node.objects.filter(cluster=cluster).values("id", "name", "state", "last_seen")
    # an element an open incident names is drawn at least as bad as the incident says
    flagged = open_incident_health(cluster.pk)

    def elements(kind, rows):
        return [{**row, "health": worse(row["health"], flagged.get((kind, row["name"])))} for row in rows]

    return {
        "cluster": cluster.pk,
        "generated_at": timezone.now().isoformat(),
        "nodes": [
            {"id": n["id"], "name": n["name"], "state": n["state"],
             "health": worse(NODE_STATE_HEALTH[n["state"]], flagged.get(("host", n["name"]))),
             "last_seen": n["last_seen"].isoformat() if n["last_seen"] else None}
            for n in nodes
        ],
        "switches": elements("switch", Switch.objects.filter(cluster=cluster).values("id", "name", "health")),
        "nics": elements("nic", Nic.objects.filter(cluster=cluster, in_topology=True).values("id", "name", "health")),
        "links": elements("link", Link.objects.filter(cluster=cluster).values("id", "name", "health")),
        "incidents": open_incidents(cluster.pk),
    }
