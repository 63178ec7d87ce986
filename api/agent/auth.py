"""Node credentials (`Authorization: Bearer lsn_...`) for the agent endpoints."""

from __future__ import annotations

from console.fleet.models import Node, NodeCredential, NodeState


class AgentError(Exception):
    """An error answer for an agent: a code it acts on and a sentence it logs."""

    def __init__(self, code: str, detail: str, status: int, field: str | None = None, problem: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.code, self.detail, self.status, self.field = code, detail, status, field
        self.problem = problem or detail
        self.headers = headers or {}

    def body(self) -> dict:
        body = {"error": self.code, "detail": self.detail}
        if self.field:
            body["fields"] = {self.field: self.problem}
        return body


# Every agent request runs this: leave the node's large JSON columns in the database.
CREDENTIALS = NodeCredential.objects.select_related("node").defer(
    "node__inventory", "node__facts", "node__agent_status", "node__health_report"
)


def node_for_credential(authorization: str) -> Node:
    """The node a credential belongs to, or AgentError (401 unknown/revoked, 403 retired)."""
    scheme, _, plaintext = (authorization or "").partition(" ")
    if scheme != "Bearer" or not plaintext:
        raise AgentError("node_credential_invalid", "Missing 'Authorization: Bearer lsn_...' header.", 401)
    credential = NodeCredential.lookup(plaintext.strip(), queryset=CREDENTIALS)
    if credential is None or credential.is_revoked or credential.is_expired:
        raise AgentError(
            "node_credential_invalid",
            "This node credential is not valid (unknown, revoked or replaced by a newer enrollment). "
            "Re-enroll the node with a new enrollment token.",
            401,
        )
    node = credential.node
    if node.state == NodeState.RETIRED:
        raise AgentError("node_retired", "This node was retired in the console; stop the agent or re-enroll.", 403)
    return node
