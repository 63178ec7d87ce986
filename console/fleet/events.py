"""Live events about fleet objects, so every publisher says the same thing."""

from __future__ import annotations

from console.live.publish import publish


def cluster_changed(organization_id: int, cluster_id: int, **data) -> None:
    """Tell the organization's pages (the cluster list) that a cluster or its node counts changed."""
    publish(organization_id, None, "cluster", {"id": cluster_id, **data}, key=str(cluster_id))


def node_changed(node) -> None:
    """Tell the cluster's pages how to redraw one node, and the organization's that counts moved."""
    publish(node.organization_id, node.cluster_id, "node", {
        "id": node.pk,
        "name": node.name,
        "state": node.state,
        "health": node.health,
        "last_seen": node.last_seen.isoformat() if node.last_seen else None,
    }, key=str(node.pk))
    cluster_changed(node.organization_id, node.cluster_id)
