"""HTTP client for the agent protocol (docs/agent-protocol.md).

One :class:`Client` per thread: each owns its own ``requests.Session`` so the
heartbeat, the long poll, result posts and telemetry never wait on each other.
Every request has a timeout; nothing here blocks forever.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import requests

from agent import __version__
from agent.backoff import retry_after_s

API_PREFIX = "/api/v1/agent"
USER_AGENT = f"lockstep-agent/{__version__}"


class ConsoleError(Exception):
    """The console answered with an error (or not at all)."""

    def __init__(self, status: int | None, code: str, detail: str, body: Any = None, retry_after_s: float = 0.0):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body
        self.retry_after_s = retry_after_s  # the console's Retry-After (a busy 503, a 429)

    @property
    def transient(self) -> bool:
        """Worth retrying later: unreachable, timeouts, 5xx, 429."""
        return self.status is None or self.status >= 500 or self.status == 429


class Unreachable(ConsoleError):
    """No HTTP answer: connection refused, DNS, TLS, timeout."""

    def __init__(self, detail: str):
        super().__init__(None, "console_unreachable", detail)


class Client:
    def __init__(self, base_url: str, credential: str | None = None, timeout: float = 15.0):
        self.base_url = base_url.rstrip("/")
        self.credential = credential
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = USER_AGENT

    def close(self) -> None:
        self.session.close()

    # -- plumbing ---------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict | None = None,
        timeout: float | None = None,
        auth: bool = True,
        data: bytes | None = None,
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if auth:
            if not self.credential:
                raise ConsoleError(None, "not_enrolled", "this node has no credential yet")
            headers["Authorization"] = f"Bearer {self.credential}"
        if body is not None and data is None:
            data = json.dumps(body, separators=(",", ":")).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        url = self.base_url + API_PREFIX + path
        try:
            resp = self.session.request(
                method, url, data=data, params=params, headers=headers, timeout=(5.0, timeout or self.timeout)
            )
        except requests.exceptions.RequestException as exc:
            raise Unreachable(f"{method} {url}: {exc.__class__.__name__}: {exc}") from None
        try:
            payload = resp.json() if resp.content else {}
        except ValueError:
            payload = {"detail": resp.text[:300]}
        if resp.status_code >= 400:
            code = payload.get("error") if isinstance(payload, dict) else None
            detail = payload.get("detail", "") if isinstance(payload, dict) else ""
            raise ConsoleError(resp.status_code, code or f"http_{resp.status_code}", str(detail or ""), payload,
                               retry_after_s(resp.headers.get("Retry-After")))
        return resp.status_code, payload

    # -- protocol ---------------------------------------------------------------------

    def enroll(self, token: str, host: dict, cluster_id: int | None = None) -> dict:
        """With a credential set (re-enrollment), it is sent as the proof that this is the node that
        holds it: the console lets a token alone enroll only a node without an active credential."""
        body: dict[str, Any] = {"token": token, "host": host}
        if cluster_id is not None:
            body["cluster_id"] = cluster_id
        _, payload = self._request("POST", "/enroll", body, auth=bool(self.credential))
        if not isinstance(payload, dict) or not str(payload.get("credential", "")).startswith("lsn_"):
            raise ConsoleError(201, "bad_answer", f"enrollment answer has no node credential: {payload!r:.200}")
        return payload

    def heartbeat(self, body: dict) -> dict:
        return self._request("POST", "/heartbeat", body)[1]

    def poll(self, wait: float, max_commands: int = 10) -> list[dict]:
        _, payload = self._request(
            "GET", "/commands", params={"wait": int(wait), "max": max_commands}, timeout=wait + 15.0
        )
        commands = payload.get("commands") if isinstance(payload, dict) else None
        if not isinstance(commands, list):
            raise ConsoleError(200, "bad_answer", f"poll answer has no command list: {payload!r:.200}")
        return commands

    def post_result(self, command_id: str, status: str, result: Any, error: str) -> dict:
        path = f"/commands/{quote(command_id, safe='')}/result"
        return self._request("POST", path, {"status": status, "result": result, "error": error})[1]

    def post_telemetry(self, data: bytes) -> tuple[int, dict]:
        """Post an already-encoded batch (its size was checked against the bound)."""
        return self._request("POST", "/telemetry", data=data)

    def put_inventory(self, document: dict) -> dict:
        return self._request("PUT", "/inventory", document)[1]
