"""Issue 9 from outside: a real uvicorn console probed as an attacker or a careless client would,
over raw HTTP and websockets (findings 2, 6, 7 and 10)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import threading
from datetime import datetime, timezone
from urllib.parse import urlsplit

import pytest
import requests
import websockets
from django.test import Client

from console.fleet.models import Cluster
from tests.conftest import World
from tests.factories import make_enrollment_token, make_fleet
from tests.integration.conftest import Process, free_port, process_env, wait_until

pytestmark = pytest.mark.slow

GIB = 1024 * 1024 * 1024


@pytest.fixture
def world(transactional_db, django_user_model):
    return World(django_user_model)


@contextlib.contextmanager
def console_process(tmp_path, name: str, **env):
    """The console under uvicorn with `env` on top of the test database's environment."""
    port = free_port()
    server = Process([sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1",
                      "--port", str(port), "--lifespan", "off"], {**process_env(), **env}, tmp_path / f"{name}.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=1).ok, 30, "the console to start")
        yield base
    finally:
        server.stop()


def _session_cookie(world, name: str) -> str:
    client = Client()
    client.force_login(world.users[name])
    return client.cookies["sessionid"].value


def _status_line(sock: socket.socket) -> str:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0].decode()


def _declared(base: str, method: str, path: str, length: int, headers: dict[str, str] | None = None) -> str:
    """Send only the headers of a request that declares a `length`-byte body; the status line of
    the answer (a server that waits for the body answers nothing: the socket times out)."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                 f"Content-Length: {length}", *(f"{k}: {v}" for k, v in (headers or {}).items()), "", ""]
        sock.sendall("\r\n".join(lines).encode())
        return _status_line(sock)


def _streamed(base: str, path: str, total: int, headers: dict[str, str]) -> tuple[str, int]:
    """POST a chunked body (no Content-Length) of up to `total` bytes while reading the answer;
    (its status line, the bytes sent before it came)."""
    parts = urlsplit(base)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
    sent = 0
    answered = threading.Event()

    def send() -> None:
        nonlocal sent
        chunk = b"[" * 65536
        try:
            while sent < total and not answered.is_set():
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
            sock.sendall(b"0\r\n\r\n")
        except OSError:  # the server answered and closed: what is being tested
            pass

    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
             "Transfer-Encoding: chunked", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    sock.sendall("\r\n".join(lines).encode())
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        status = _status_line(sock)
    finally:
        answered.set()
        sender.join(30)
        sock.close()
    return status, sent


# --- finding 2: bodies bounded per route, before they are read --------------------------------

@pytest.mark.parametrize("path", ["/login/", "/api/v1/agent/enroll", "/api/v1/clusters/"])
def test_a_declared_gigabyte_is_refused_before_a_byte_of_it_is_read(world, live_console, path):
    assert _declared(live_console, "POST", path, GIB) == "HTTP/1.1 413 Request Entity Too Large"


def test_a_streamed_body_past_the_routes_bound_is_refused_while_it_arrives(world, live_console):
    # A viewer's token, a chunked body of `[`: before, the whole body was read and parsed before the 403.
    status, sent = _streamed(live_console, "/api/v1/clusters/", 64 * 1024 * 1024,
                             {"Authorization": f"Bearer {world.token('bob')}"})
    assert status == "HTTP/1.1 413 Request Entity Too Large"
    assert sent < 64 * 1024 * 1024  # answered while the body was still coming


def test_only_topology_import_and_telemetry_take_large_bodies(world, live_console):
    from testbed.topogen import generate

    fleet = make_fleet(world.acme)
    topology = json.dumps(generate(hosts=256, rails=8, hosts_per_leaf=16, spines=2, name="big")).encode()
    assert len(topology) > 256 * 1024
    carol = {"Authorization": f"Bearer {world.token('carol')}", "Content-Type": "application/json"}
    imported = requests.put(f"{live_console}/api/v1/clusters/{fleet.cluster.pk}/topology/", data=topology,
                            headers=carol, timeout=120)
    assert imported.status_code == 200, imported.text[:300]
    # The same size anywhere else: 413, named.
    other = requests.patch(f"{live_console}/api/v1/clusters/{fleet.cluster.pk}/", data=topology, headers=carol,
                           timeout=30)
    assert other.status_code == 413 and other.json()["error"] == "too_large"
    assert "at most 262144 bytes" in other.json()["detail"]
    credential = _enroll(live_console, make_enrollment_token(fleet.cluster), "big-batch-host")
    batch = _batch(1, records=300)
    assert len(batch) > 256 * 1024
    stored = requests.post(f"{live_console}/api/v1/agent/telemetry", data=batch, timeout=60,
                           headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"})
    assert stored.status_code == 202, stored.text


def test_a_create_is_refused_to_a_caller_without_the_role_before_its_body_is_parsed(world):
    # A viewer's body is not parsed at all: not JSON, still the 403 (before: a 400 from the parser).
    response = world.client("bob").post("/api/v1/clusters/", data=b"[" * 200_000, content_type="application/json")
    assert response.status_code == 403, response.content[:200]
    assert response.json()["detail"] == "This needs the operator role in one of your organizations."


# --- finding 6: one node's flood leaves the other tenants their share ------------------------------

def _enroll(base: str, token: str, hostname: str) -> str:
    answer = requests.post(f"{base}/api/v1/agent/enroll", timeout=30,
                           json={"token": token, "host": {"hostname": hostname, "machine_id": f"m-{hostname}"}})
    assert answer.status_code == 201, answer.text
    return answer.json()["credential"]


def _batch(seq: int, records: int) -> bytes:
    now = datetime.now(timezone.utc).isoformat()
    return json.dumps({"seq": seq, "records": [
        {"kind": "event.job.heartbeat", "ts": now, "data": {"job": "padded", "generation": i, "pad": "x" * 900}}
        for i in range(records)
    ]}).encode()


def test_a_node_past_its_share_is_told_to_come_back_and_another_organizations_node_is_not(world, tmp_path):
    acme, globex = make_fleet(world.acme), make_fleet(world.globex)
    # A small share, so that two batches exceed it whatever the machine's speed.
    with console_process(tmp_path, "shares", LOCKSTEP_TELEMETRY_NODE_BYTES_PER_S="1",
                         LOCKSTEP_TELEMETRY_NODE_BURST_BYTES="200000") as base:
        flooder = _enroll(base, make_enrollment_token(acme.cluster), "flooder")
        other = _enroll(base, make_enrollment_token(globex.cluster), "quiet")

        def post(credential: str, seq: int) -> requests.Response:
            return requests.post(f"{base}/api/v1/agent/telemetry", data=_batch(seq, records=150), timeout=60,
                                 headers={"Authorization": f"Bearer {credential}",
                                          "Content-Type": "application/json"})

        assert post(flooder, 1).status_code == 202
        refused = post(flooder, 2)
        assert refused.status_code == 503 and refused.json()["error"] == "over_share", refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert post(other, 1).status_code == 202  # the other organization's node is not held back
        beat = requests.post(f"{base}/api/v1/agent/heartbeat", json={}, timeout=30,
                             headers={"Authorization": f"Bearer {other}"})
        assert beat.status_code == 200


# --- finding 7: production by default, no settings or traceback on any page ------------------------

def test_an_error_page_shows_no_settings_and_no_traceback_even_in_debug(world, tmp_path):
    secret_url = "postgresql://lockstep:hunter2-db-password@127.0.0.1:1/lockstep_gone"
    with console_process(tmp_path, "broken-db", DEBUG="true", DATABASE_URL=secret_url) as base:
        # A session cookie makes the page look the session up in the database, which is not there.
        page = requests.get(f"{base}/clusters/", cookies={"sessionid": "x" * 32}, timeout=30)
    assert page.status_code == 500
    for leak in ("hunter2-db-password", "DATABASE_URL", "Traceback", "SECRET_KEY", "INSTALLED_APPS"):
        assert leak not in page.text, leak
    assert "The traceback is in the console's log" in page.text


# --- finding 7 and 10: websockets -------------------------------------------------------------------

def test_a_websocket_from_another_origin_is_refused_in_debug_mode_too(world, live_console):
    url = live_console.replace("http://", "ws://") + "/ws/live/"
    cookie = {"Cookie": f"sessionid={_session_cookie(world, 'bob')}"}

    async def outcome(headers) -> str:
        try:
            async with websockets.connect(url, additional_headers=headers, open_timeout=20) as ws:
                await ws.send(json.dumps({"subscribe": [f"o{world.acme.pk}"]}))
                return json.loads(await asyncio.wait_for(ws.recv(), 20))["type"]
        except websockets.exceptions.InvalidHandshake as exc:
            return f"refused: {exc}"

    for evil in ({**cookie, "Origin": "http://evil.example"}, {**cookie, "Origin": "null"}, cookie):
        assert asyncio.run(outcome(evil)).startswith("refused"), evil
    assert asyncio.run(outcome({**cookie, "Origin": live_console})) == "subscribed"


def test_a_bad_websocket_frame_gets_an_error_and_the_socket_stays_open(world, live_console):
    url = live_console.replace("http://", "ws://") + "/ws/live/"
    headers = {"Cookie": f"sessionid={_session_cookie(world, 'bob')}", "Origin": live_console}

    async def talk() -> list[dict]:
        answers = []
        async with websockets.connect(url, additional_headers=headers, open_timeout=20) as ws:
            for frame in (b"\x00\xffbinary", "not json {", "[1, 2]", '{"subscribe": "o1"}',
                          '{"unsubscribe": [{"a": 1}]}', "[" * 100_000 + "]" * 100_000,
                          json.dumps({"subscribe": [f"o{world.acme.pk}"]})):
                await ws.send(frame)
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
        return answers

    answers = asyncio.run(talk())
    assert [a["type"] for a in answers[:4]] == ["error"] * 4, answers
    assert answers[-1] == {"type": "subscribed", "groups": [f"o{world.acme.pk}"], "denied": []}


# --- finding 10: the policy on every page, no server paths to anonymous callers ----------------------

def test_every_page_carries_the_content_security_policy(world, live_console):
    fleet = make_fleet(world.acme)
    cookies = {"sessionid": _session_cookie(world, "alice")}
    for path in ("/login/", "/clusters/", f"/clusters/{fleet.cluster.pk}/", "/api/v1/docs/", "/api/v1/",
                 "/no-such-page/"):
        response = requests.get(f"{live_console}{path}", cookies=cookies, timeout=30)
        policy = response.headers.get("Content-Security-Policy", "")
        assert "script-src 'self'" in policy and "style-src 'self'" in policy, (path, policy)
        assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
        assert "<script>" not in response.text and " style=" not in response.text, path
    assert Cluster.objects.filter(pk=fleet.cluster.pk).exists()
