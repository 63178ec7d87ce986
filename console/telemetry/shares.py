"""This console process's telemetry fair shares (console/telemetry/fairshare.py), from settings,
and the refusal of a node's extra batch on its headers alone (console/agent_handler.py)."""

from __future__ import annotations

import json

from django.conf import settings

from console.telemetry.fairshare import INFLIGHT_RETRY_S, FairShare, Shares

TELEMETRY_PATH = "/api/v1/agent/telemetry"

TELEMETRY_SHARES = FairShare(Shares(
    node_inflight=settings.LOCKSTEP["TELEMETRY_NODE_CONCURRENCY"],
    node_bytes_per_s=settings.LOCKSTEP["TELEMETRY_NODE_BYTES_PER_S"],
    node_burst_bytes=settings.LOCKSTEP["TELEMETRY_NODE_BURST_BYTES"],
))

OVER_SHARE_DETAIL = "This node is over its share of telemetry storage; keep this batch and send it again later."


def credential_key(authorization: str) -> str:
    """The public key part of `Bearer lsn_<key>.<secret>` ('' for anything else)."""
    scheme, _, token = authorization.partition(" ")
    key, dot, _ = token.strip().partition(".")
    return key if scheme == "Bearer" and dot and key.startswith("lsn_") else ""


def early_refusal(scope) -> list[dict] | None:
    """The 503 to send, without reading the body, for a telemetry batch of a node whose batches
    are all in flight; None to go on."""
    if scope["path"].rstrip("/") != TELEMETRY_PATH:
        return None
    authorization = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
    if not TELEMETRY_SHARES.busy(credential_key(authorization.decode("latin-1"))):
        return None
    body = json.dumps({"error": "over_share", "detail": OVER_SHARE_DETAIL}).encode()
    return [
        {"type": "http.response.start", "status": 503,
         "headers": [(b"content-type", b"application/json"), (b"retry-after", str(int(INFLIGHT_RETRY_S)).encode()),
                     (b"connection", b"close")]},
        {"type": "http.response.body", "body": body},
    ]
