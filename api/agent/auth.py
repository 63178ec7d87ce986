"""Node credentials (`Authorization: Bearer lsn_...`) for the agent endpoints."""

from __future__ import annotations

from console.core import scoping
from console.core.errors import Forbidden, Unauthenticated
from console.fleet.models import Node, NodeCredential, NodeState

# Every agent request runs this: leave the node's large JSON columns in the database.
CREDENTIALS = NodeCredential.objects.select_related("node").defer(
    "node__inventory", "node__facts", "node__agent_status", "node__health_report"
)


def node_for_credential(authorization: str) -> Node:
    """The node a credential belongs to: Unauthenticated (unknown, revoked) or Forbidden (retired)
    otherwise. The caller then works in the node's organization."""
    scheme, _, plaintext = (authorization or "").partition(" ")
    if scheme != "Bearer" or not plaintext:
        raise Unauthenticated("Missing 'Authorization: Bearer lsn_...' header.", code="node_credential_invalid")
    with scoping.unscoped("find the node of the credential an agent presents"):
        credential = NodeCredential.lookup(plaintext.strip(), queryset=CREDENTIALS)
    if credential is None or credential.is_revoked or credential.is_expired:
        raise Unauthenticated(
            "This node credential is not valid (unknown, revoked or replaced by a newer enrollment). "
            "Re-enroll the node with a new enrollment token.",
            code="node_credential_invalid",
        )
    node = credential.node
    if node.state == NodeState.RETIRED:
        raise Forbidden("This node was retired in the console; stop the agent or re-enroll.", code="node_retired")
    return node
