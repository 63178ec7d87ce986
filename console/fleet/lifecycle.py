"""Node states and the transitions between them.

enrolling ──first contact──▶ ready ──silent > NODE_LOST_AFTER_S──▶ lost ──contact──▶ ready
ready/lost ──drain──▶ draining ──undrain──▶ ready;   any ──retire──▶ retired (credentials revoked)

Every transition is a conditional UPDATE on the expected old state, so concurrent callers (two
sweeps, a sweep and a heartbeat) each move a node at most once, and it publishes a live event.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.fleet.events import node_changed
from console.fleet.models import Node, NodeCredential, NodeState

# A node heard from this recently is not written again (agents talk every few seconds).
SEEN_RESOLUTION = timedelta(seconds=5)
CONTACT_REVIVES = (NodeState.ENROLLING, NodeState.LOST)


class TransitionRefused(ValueError):
    pass


def mark_seen(node: Node, now=None) -> Node:
    """Record contact from a node's agent; an enrolling or lost node becomes ready."""
    now = now or timezone.now()
    if node.state in CONTACT_REVIVES and _transition(node, CONTACT_REVIVES, NodeState.READY, now, last_seen=now):
        return node
    if node.last_seen is None or now - node.last_seen >= SEEN_RESOLUTION:
        Node.objects.filter(pk=node.pk).update(last_seen=now)
        node.last_seen = now
    return node


def sweep_lost(now=None) -> int:
    """Mark ready nodes that have been silent too long as lost. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.LOCKSTEP["NODE_LOST_AFTER_S"])
    moved = 0
    for node in Node.objects.filter(state=NodeState.READY, last_seen__lt=cutoff).only(
        "id", "organization_id", "cluster_id", "name", "state", "last_seen"
    ):
        moved += _transition(node, (NodeState.READY,), NodeState.LOST, now, extra_filter={"last_seen__lt": cutoff})
    return moved


def drain(node: Node) -> None:
    if not _transition(node, (NodeState.READY, NodeState.LOST, NodeState.ENROLLING), NodeState.DRAINING):
        raise TransitionRefused(f"a {node.state} node cannot be drained")


def undrain(node: Node) -> None:
    if not _transition(node, (NodeState.DRAINING,), NodeState.READY):
        raise TransitionRefused(f"only a draining node can be returned to service (this one is {node.state})")


def retire(node: Node) -> None:
    with transaction.atomic():
        if not _transition(node, tuple(s for s in NodeState if s != NodeState.RETIRED), NodeState.RETIRED):
            raise TransitionRefused("the node is already retired")
        now = timezone.now()
        NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)


def _transition(node: Node, from_states, to_state, now=None, extra_filter=None, **fields) -> bool:
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, state__in=list(from_states), **(extra_filter or {})).update(
        state=to_state, state_changed=now, updated=now, **fields
    )
    if not updated:
        return False
    node.state, node.state_changed = to_state, now
    for key, value in fields.items():
        setattr(node, key, value)
    node_changed(node)
    return True
