"""Protocol conformance of the console the agent talks to (docs/agent-protocol.md), via the agent's client.

They run against the ``console`` fixture: today the fake, later the real console with the
same fixture interface, so the agent and the console are checked against one document.
"""

from __future__ import annotations

import json
import threading

import pytest
from agent_testlib import wait_for

from agent.client import Client, ConsoleError

pytestmark = pytest.mark.timeout(60)

HOST = {"hostname": "proto-0", "machine_id": "proto-machine-0", "kernel": "6.1", "agent_version": "0.1.0"}


def enrolled(console, hostname="proto-0", machine_id="proto-machine-0") -> tuple[Client, dict]:
    answer = Client(console.url).enroll(console.create_token(), {**HOST, "hostname": hostname,
                                                                 "machine_id": machine_id})
    return Client(console.url, answer["credential"]), answer


def test_enroll_answer_and_heartbeat(console):
    client, answer = enrolled(console)
    assert set(answer) >= {"node_id", "node_name", "cluster_id", "organization_id", "credential",
                           "heartbeat_interval_s", "poll_wait_s", "telemetry_max_batch_bytes",
                           "telemetry_max_records"}
    assert answer["credential"].startswith("lsn_") and answer["node_name"] == "proto-0"
    beat = client.heartbeat({"agent_version": "0.1.0"})
    assert beat["node_state"] == "ready" and beat["server_time"].endswith("Z")
    with pytest.raises(ConsoleError) as info:
        Client(console.url).enroll(console.create_token(), {"hostname": "x"})
    assert info.value.status == 400 and "machine_id" in json.dumps(info.value.body.get("fields"))


def test_claims_leases_and_redelivery(console):
    client, answer = enrolled(console)
    node = answer["node_id"]
    first, second = console.enqueue(node, "test.echo", {"text": "a"}), console.enqueue(node, "test.echo")
    got: list[list[dict]] = []

    def poll() -> None:
        got.append(Client(console.url, answer["credential"]).poll(wait=2, max_commands=1))

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    ids = sorted(c["id"] for batch in got for c in batch)
    assert ids == sorted([first, second])  # two concurrent polls never get the same command
    cmd = next(c for batch in got for c in batch if c["id"] == first)
    assert set(cmd) == {"id", "type", "args", "timeout_s", "attempt", "issued_at"} and cmd["attempt"] == 1

    assert client.poll(wait=0) == []  # claimed commands are not offered while leased
    for attempt in (2, 3):
        console.redeliver(first)
        again = client.poll(wait=2)
        assert [(c["id"], c["attempt"]) for c in again] == [(first, attempt)]
    console.redeliver(first)
    assert client.poll(wait=0) == []
    assert console.command(first).state == "expired"


def test_results_are_accepted_once(console):
    client, answer = enrolled(console)
    other, _ = enrolled(console, "proto-1", "proto-machine-1")
    cid = console.enqueue(answer["node_id"], "test.echo")
    client.poll(wait=1)
    assert client.post_result(cid, "succeeded", {"ok": 1}, "") == {"accepted": True}
    assert client.post_result(cid, "failed", None, "late") == {"accepted": False, "reason": "already completed"}
    assert console.command(cid).result == {"ok": 1}
    with pytest.raises(ConsoleError) as info:
        other.post_result(cid, "succeeded", {}, "")
    assert info.value.status == 404
    big = console.enqueue(answer["node_id"], "test.echo")
    with pytest.raises(ConsoleError) as info:
        client.post_result(big, "succeeded", {"blob": "x" * (answer["telemetry_max_batch_bytes"] + 1)}, "")
    assert info.value.status == 413 and console.command(big).state != "succeeded"


def test_telemetry_seq_dedup_bounds_and_validation(console):
    client, answer = enrolled(console)
    node = answer["node_id"]
    batch = {"seq": 1, "dropped": 2, "records": [
        {"kind": "node.health", "ts": "2026-11-29T17:00:00Z", "data": {"load1": 0.3}},
        {"kind": "probe.window", "ts": 1796403600.25, "data": {}}]}
    status, body = client.post_telemetry(json.dumps(batch).encode())
    assert (status, body) == (202, {"accepted": 2})
    status, body = client.post_telemetry(json.dumps(batch).encode())
    assert (status, body) == (200, {"accepted": 0, "duplicate": True})
    assert len(console.telemetry_records(node)) == 2 and console.dropped(node) == 2

    bad = {"seq": 2, "dropped": 0, "records": [batch["records"][0], {"kind": "x.y", "ts": "yesterday", "data": {}}]}
    with pytest.raises(ConsoleError) as info:
        client.post_telemetry(json.dumps(bad).encode())
    assert info.value.status == 400 and "records[1].ts" in info.value.body["fields"]
    too_many = {"seq": 3, "dropped": 0,
                "records": [batch["records"][1]] * (answer["telemetry_max_records"] + 1)}
    with pytest.raises(ConsoleError) as info:
        client.post_telemetry(json.dumps(too_many).encode())
    assert info.value.status == 413 and info.value.code == "batch_too_large"
    assert len(console.telemetry_records(node)) == 2  # nothing of a refused batch is stored


def test_inventory_and_credential_errors(console):
    client, answer = enrolled(console)
    doc = {"format": "lockstep.inventory/v1", "collected_at": "2026-11-29T17:00:00Z", "host": HOST,
           "gpus": [], "nics": [], "affinity": [], "errors": []}
    assert client.put_inventory(doc) == {"gpus": 0, "nics": 0}
    with pytest.raises(ConsoleError) as info:
        client.put_inventory({**doc, "format": "v0"})
    assert info.value.status == 400 and "format" in info.value.body["fields"]
    with pytest.raises(ConsoleError) as info:
        Client(console.url, "lsn_AAAAAAAAAAAA.unknown").heartbeat({})
    assert (info.value.status, info.value.code) == (401, "node_credential_invalid")
    console.retire(answer["node_id"])
    with pytest.raises(ConsoleError) as info:
        client.heartbeat({})
    assert (info.value.status, info.value.code) == (403, "node_retired")


def test_daemon_emits_periodic_node_health(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token(), health_interval_s="0.2")
    node = running.daemon.cred.node_id
    record = wait_for(
        lambda: next((r for r in console.telemetry_records(node) if r["kind"] == "node.health"), None),
        15, "a node.health telemetry record",
    )
    assert {"load1", "memory_available_bytes", "uptime_s", "ok", "problems"} <= set(record["data"])
    assert isinstance(record["ts"], float)
