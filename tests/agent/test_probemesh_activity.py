"""The probe.mesh activity in a running agent, driven by activity.set from the (fake) console:
windows arrive as probe.window telemetry, a re-plan changes the peers without restarting the
agent or its helper, bad plans fail the command with the field named and change nothing, the
health says which engine runs (and that it is degraded where the helper is not built), and a
stop ends the helper."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from agent_testlib import wait_for
from probemesh_testlib import free_udp_port, loopback_base

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def helper_built():
    subprocess.run(["make", "-s", "native"], cwd=REPO, check=True, capture_output=True)


def node_of(running) -> int:
    return wait_for(lambda: running.daemon.cred and running.daemon.cred.node_id, 15, "enrollment")


def finished(console, cid: str):
    command = console.command(cid)
    return command if command.state in ("succeeded", "failed") else None


def mesh_health(console, node: int) -> dict | None:
    beats = console.heartbeats(node)
    if not beats:
        return None
    return next((a for a in beats[-1].get("activities", []) if a["name"] == "probe.mesh"), None)


def plan(base: str, port: int, pairs: list[tuple[int, int]], nics: int = 3) -> dict:
    peers = {i: [] for i in range(nics)}
    for a, b in pairs:
        peers[a].append([f"node-a/nic{b}", f"{base}.{b + 1}"])
    return {"nics": [{"name": f"node-a/nic{i}", "address": f"{base}.{i + 1}", "peers": peers[i]} for i in range(nics)],
            "port": port, "sport_first": port + 100, "sport_count": 4, "window_ms": 250, "deadline_floor_ms": 150,
            "paths": {"enabled": False}}


def windows(console, node: int) -> list[dict]:
    return [r["data"] for r in console.telemetry_records(node) if r["kind"] == "probe.window"]


def pairs_in(records: list[dict]) -> set[tuple[str, str]]:
    return {(p["src"], p["dst"]) for r in records for p in r["probes"] if p["via"] == "probe"}


def test_activity_set_runs_the_mesh_replans_it_in_place_and_stops_it(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    base, port = loopback_base(), free_udp_port()
    cid = console.enqueue(node, "activity.set", {"name": "probe.mesh", "args": plan(base, port, [(0, 1), (1, 0)]),
                                                 "revision": 1})
    result = wait_for(lambda: finished(console, cid), 20, "activity.set")
    assert result.status == "succeeded", result.error
    assert result.result["desired"]["args"]["sport_count"] == 4
    wait_for(lambda: len(windows(console, node)) >= 6, 30, "probe.window telemetry")
    recs = windows(console, node)
    assert {r["nic"] for r in recs} == {"node-a/nic0", "node-a/nic1", "node-a/nic2"}
    assert pairs_in(recs) == {("node-a/nic0", "node-a/nic1"), ("node-a/nic1", "node-a/nic0")}
    # every window after the first few carries probes of each planned pair, none lost on loopback;
    # how many fit in a window depends on the machine's load, which the bench measures, not this test
    full = [p for r in recs[3:] for p in r["probes"] if p["via"] == "probe"]
    assert full and all(p["lost"] == 0 and p["sent"] > 0 for p in full), full
    health = wait_for(lambda: (h := mesh_health(console, node)) and h.get("status", {}).get("windows") and h,
                      20, "the mesh's health in a heartbeat")
    assert health["state"] == "running" and health["status"]["engine"] == "native"
    assert health["status"]["peers"] == 2 and "degraded" not in health["status"]
    helper = health["status"]["helper_pid"]

    # re-plan: nic2 joins, nic1 -> nic0 goes; the agent and its helper keep running
    seen = len(windows(console, node))
    cid = console.enqueue(node, "activity.set", {"name": "probe.mesh",
                                                 "args": plan(base, port, [(0, 1), (2, 0), (0, 2)]), "revision": 2})
    assert wait_for(lambda: finished(console, cid), 20, "the re-plan").status == "succeeded"
    # windows that straddle the re-plan still carry the old plan's pairs; once each NIC has reported
    # under the new plan, the newest window of every NIC holds exactly the new pairs
    def newest_per_nic() -> list[dict]:
        return list({r["nic"]: r for r in windows(console, node)[seen:]}.values())

    replanned = {("node-a/nic0", "node-a/nic1"), ("node-a/nic2", "node-a/nic0"), ("node-a/nic0", "node-a/nic2")}
    wait_for(lambda: pairs_in(newest_per_nic()) == replanned, 30, "every NIC's newest window on the new plan")
    health = wait_for(lambda: (h := mesh_health(console, node)) and h.get("revision") == 2 and h, 20,
                      "the re-planned health")
    assert health["status"]["helper_pid"] == helper and health["restarts"] == 0
    assert os.path.exists(f"/proc/{helper}")

    # a bad plan fails the command, naming the field, and the mesh keeps the plan it had
    bad = plan(base, port, [(0, 1)])
    bad["nics"][1]["peers"] = [["node-a/nic0", "127.0.0.300"]]
    cid = console.enqueue(node, "activity.set", {"name": "probe.mesh", "args": bad, "revision": 3})
    refused = wait_for(lambda: finished(console, cid), 20, "the refused plan")
    assert refused.status == "failed"
    assert refused.error == ("Invalid arguments: activity 'probe.mesh': nics[1].peers[0][1]: '127.0.0.300' is "
                             "not an IPv4 address.")
    assert running.daemon.supervisor.state_of("probe.mesh")["revision"] == 2

    cid = console.enqueue(node, "activity.set", {"name": "probe.mesh", "state": "stopped", "revision": 4})
    assert wait_for(lambda: finished(console, cid), 20, "the stop").status == "succeeded"
    wait_for(lambda: not os.path.exists(f"/proc/{helper}"), 15, "the helper to exit")
    wait_for(lambda: (h := mesh_health(console, node)) and h["state"] == "stopped", 15, "a stopped mesh")


def test_without_the_helper_the_mesh_runs_degraded_and_says_so(console, start_daemon, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_PROBED", "/nonexistent/lockstep-probed")
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    base, port = loopback_base(), free_udp_port()
    many = plan(base, port, [(0, 1), (1, 0)], nics=2)
    many["interval_ms"] = 1.5  # 4 peers: 2,667 probes/s asked, more than the Python engine's 2,000
    many["window_ms"] = 250
    many["deadline_floor_ms"] = 60  # at most 60 intervals less the grace
    many["nics"][0]["peers"] += [[f"ghost{k}/nic0", f"{base}.{100 + k}"] for k in range(2)]
    cid = console.enqueue(node, "activity.set", {"name": "probe.mesh", "args": many})
    assert wait_for(lambda: finished(console, cid), 20, "activity.set").status == "succeeded"
    health = wait_for(lambda: (h := mesh_health(console, node)) and h.get("status", {}).get("windows") and h,
                      30, "a degraded mesh's health")
    status = health["status"]
    assert status["engine"] == "python"
    assert "native helper" in status["degraded"] and "not built" in status["degraded"]
    assert "capped at 2,000" in status["degraded"] and status["interval_ms"] == 2.0
    recs = wait_for(lambda: len(windows(console, node)) >= 4 and windows(console, node), 30, "windows")
    assert all(r["engine"] == "python" and r["interval_ms"] == 2.0 for r in recs)
    pair = [p for r in recs[2:] for p in r["probes"] if (p["src"], p["dst"], p["via"]) ==
            ("node-a/nic0", "node-a/nic1", "probe")]
    # the pair is probed and answered (the Python engine shares the agent's interpreter: on this
    # loaded machine a few answers may come past the deadline)
    assert pair and sum(p["answered"] for p in pair) >= 0.9 * sum(p["sent"] for p in pair), pair
