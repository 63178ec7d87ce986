"""The daemon against the real console (``real_console``): a uvicorn process on the test database.

What matters end to end: enrollment, inventory and built-in commands land as rows; a command
delivered twice runs once; the agent rides out the console being stopped and restarted (same
port, same database): no command runs twice, the buffered telemetry arrives as rows in order
and without duplicates, and the node's ``telemetry_dropped`` is what the agent dropped.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_testlib import DATA, count_lines, wait_for
from fakes.nvml_fake import FakeNvml

from agent import client as agent_client
from agent import telemetry
from console.fleet.models import Gpu, Nic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def node_of(running) -> int:
    return running.daemon.cred.node_id


def done(console, cid: str) -> bool:
    return console.command(cid).state in ("succeeded", "failed")


def test_enrolls_reports_and_runs_builtin_commands_against_the_real_console(real_console, start_daemon):
    console = real_console
    running = start_daemon(console, enroll_token=console.create_token(), nvml=FakeNvml.hgx_h100(),
                           sysfs_root=DATA / "hgx-h100" / "sys")
    node = node_of(running)
    wait_for(lambda: console.node(node).state == "ready", 15, "the node to be ready")
    wait_for(lambda: console.node(node).inventory_at is not None, 15, "the inventory")
    assert Gpu.objects.filter(node_id=node).count() == 8
    assert Nic.objects.filter(node_id=node).count() == 12
    assert Gpu.objects.filter(node_id=node, nearest_nic__isnull=False).count() == 8
    assert set(console.heartbeats(node)[0]) >= {"uptime_s", "telemetry_buffered", "telemetry_dropped"}

    refresh = console.enqueue(node, "inventory.refresh")
    health = console.enqueue(node, "node.health")
    wait_for(lambda: done(console, refresh) and done(console, health), 20, "both built-in commands")
    assert console.command(refresh).status == "succeeded"
    assert console.command(refresh).result["host"]["hostname"] == "node-a"
    assert console.command(health).status == "succeeded"
    assert console.node(node).health_report["ok"] is True  # the console's result hook stored it


def test_a_command_delivered_again_while_it_runs_runs_once(real_console, start_daemon, tmp_path):
    console = real_console
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    ran = tmp_path / "ran.log"
    cid = console.enqueue(node, "test.record", {"path": str(ran), "sleep_s": 8})
    wait_for(lambda: count_lines(ran, cid) == 1, 15, "the command to run")
    console.redeliver(cid)  # its lease ends while it still runs: the console offers it again
    wait_for(lambda: console.command(cid).attempt == 2, 15, "the second delivery")
    wait_for(lambda: running.daemon.runner.duplicates == 1, 15, "the agent to recognise the duplicate")
    wait_for(lambda: done(console, cid), 20, "the result")
    assert console.command(cid).status == "succeeded" and console.command(cid).result == {"recorded": cid}
    assert count_lines(ran, cid) == 1


def test_the_agent_rides_out_a_console_restart(real_console, start_daemon, tmp_path, monkeypatch):
    console = real_console
    unreachable: list[float] = []
    real_request = agent_client.Client._request

    def counting(self, *args, **kwargs):
        try:
            return real_request(self, *args, **kwargs)
        except agent_client.Unreachable:
            unreachable.append(time.monotonic())
            raise

    monkeypatch.setattr(agent_client.Client, "_request", counting)
    running = start_daemon(console, enroll_token=console.create_token(), telemetry_buffer_bytes="16K",
                           backoff_max_s="0.5")
    node = node_of(running)
    wait_for(lambda: console.node(node).state == "ready", 15, "the node to be ready")
    ran = tmp_path / "ran.log"

    # A command is running when the console goes away: its result cannot be posted.
    inflight = console.enqueue(node, "test.record", {"path": str(ran), "sleep_s": 1})
    wait_for(lambda: count_lines(ran, inflight) == 1, 15, "the command to start")
    console.stop()
    down_at = time.monotonic()
    console.redeliver(inflight)  # its lease ends during the outage: it is offered again after it
    queued = [console.enqueue(node, "test.record", {"path": str(ran)}) for _ in range(3)]
    emitted = 1000
    for i in range(emitted):
        telemetry.emit("test.sample", {"i": i, "pad": "x" * 20})
    dropped_by_agent = running.daemon.buffer.stats()["dropped_total"]
    assert dropped_by_agent > 0, "the buffer bound was not exceeded"
    wait_for(lambda: done_locally(running, inflight), 10, "the running command to finish during the outage")
    # down for a while: the agent keeps failing (and backing off) for three seconds
    wait_for(lambda: len(unreachable) >= 10 and unreachable[-1] - down_at >= 3, 30,
             "three seconds of failed attempts while the console is down")

    console.start()  # same port, same database
    wait_for(lambda: all(done(console, c) for c in [inflight, *queued]), 30, "the commands after the restart")
    assert all(console.command(c).status == "succeeded" for c in [inflight, *queued])
    assert all(count_lines(ran, c) == 1 for c in [inflight, *queued]), ran.read_text()

    def accounted() -> bool:
        got = [r for r in console.telemetry_records(node) if r["kind"] == "test.sample"]
        return len(got) + console.dropped(node) == emitted

    wait_for(accounted, 30, "every record to arrive as a row or be counted as dropped")
    received = [r["data"]["i"] for r in console.telemetry_records(node) if r["kind"] == "test.sample"]
    assert received == sorted(set(received)), "telemetry rows out of order or duplicated"
    missing = set(range(emitted)) - set(received)
    assert console.dropped(node) == running.daemon.buffer.stats()["dropped_total"] == dropped_by_agent == len(missing)
    # the newest records all arrived; what was dropped is older than all of them
    start = len(received) - 1
    while start > 0 and received[start - 1] == received[start] - 1:
        start -= 1
    assert received[-1] == emitted - 1 and all(m < received[start] for m in missing)
    batches = console.telemetry_batches(node)
    assert [b["seq"] for b in batches] == list(range(1, len(batches) + 1))
    assert sum(b["dropped"] for b in batches) == dropped_by_agent
    wait_for(lambda: console.heartbeats(node) and console.heartbeats(node)[0].get("telemetry_dropped")
             == dropped_by_agent, 15, "a heartbeat that reports the drops")
    assert console.node(node).state == "ready"


def done_locally(running, cid: str) -> bool:
    return running.daemon.store.completed(cid) is not None


@pytest.fixture
def short_dir():
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ls-rc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_activity_commands_and_local_socket_events_against_the_real_console(real_console, start_daemon, tmp_path,
                                                                            short_dir):
    from agent.localsock.client import AgentSocket
    from console.commands import services as command_services
    from console.fleet.models import Node

    console = real_console
    sock_path = short_dir / "agent.sock"
    running = start_daemon(console, enroll_token=console.create_token(), agent_socket=str(sock_path))
    node = node_of(running)
    wait_for(lambda: console.node(node).state == "ready", 15, "the node to be ready")
    log = tmp_path / "ticker.log"

    # through the console's own validation: it stamps the revision
    command, _ = command_services.issue_command(Node.objects.get(pk=node), "activity.set",
                                        {"name": "test.ticker", "args": {"path": str(log), "label": "rc"}})
    assert command.args["revision"] > 0
    wait_for(lambda: done(console, str(command.pk)), 20, "activity.set")
    assert console.command(str(command.pk)).status == "succeeded"
    assert console.command(str(command.pk)).result["desired"]["revision"] == command.args["revision"]
    wait_for(lambda: log.exists() and "tick rc" in log.read_text(), 10, "the ticker to run")

    def stored_health():
        status = Node.objects.get(pk=node).agent_status or {}
        entry = next((a for a in status.get("activities", []) if a.get("name") == "test.ticker"), None)
        return entry if entry and entry["state"] == "running" else None

    entry = wait_for(stored_health, 15, "the ticker's health stored from a heartbeat")
    assert entry["revision"] == command.args["revision"] and entry["restarts"] == 0

    client = AgentSocket(str(sock_path))
    assert client.event("job.heartbeat", {"job": "j-7", "step": 3}, ts_ns=1_764_000_000_500_000_000)
    rows = wait_for(lambda: [r for r in console.telemetry_records(node) if r["kind"] == "event.job.heartbeat"], 20,
                    "the event as a telemetry row")
    assert rows[0]["data"] == {"job": "j-7", "step": 3}
    assert rows[0]["ts"].timestamp() == 1_764_000_000.5
