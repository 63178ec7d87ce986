"""The daemon against a console (the ``console`` fixture): commands, duplicates, outages, telemetry."""

from __future__ import annotations

import re
import signal
import time

import pytest
from agent_testlib import DATA, count_lines, wait_for
from fakes.nvml_fake import FakeNvml

from agent import client as agent_client
from agent import telemetry
from agent.backoff import Backoff
from agent.cli import main

pytestmark = pytest.mark.timeout(120)

HEALTH_KEYS = {"load1", "memory_available_bytes", "disk_free_bytes", "uptime_s", "gpus", "nics", "ok", "problems"}


def node_of(running) -> int:
    return running.daemon.cred.node_id


def done(console, cid: str) -> bool:
    return console.command(cid).state in ("succeeded", "failed")


def measurement_window(seconds: float) -> None:
    """Let time pass to check that nothing happens in it (not used to synchronise)."""
    time.sleep(seconds)


def test_enrolls_reports_and_runs_builtin_commands(console, start_daemon):
    running = start_daemon(
        console, enroll_token=console.create_token(), nvml=FakeNvml.hgx_h100(),
        sysfs_root=DATA / "hgx-h100" / "sys",
    )
    node = node_of(running)
    wait_for(lambda: len(console.heartbeats(node)) >= 2, 10, "two heartbeats")
    beat = console.heartbeats(node)[-1]
    assert set(beat) == {"agent_version", "uptime_s", "telemetry_buffered", "telemetry_dropped", "commands_running",
                         "activities"}
    health = {a["name"]: a for a in beat["activities"]}
    assert {"agent.heartbeat", "agent.commands", "agent.telemetry", "inventory.report", "health.report"} <= set(health)
    assert health["agent.heartbeat"]["state"] == "running" and health["agent.heartbeat"]["essential"] is True
    assert health["inventory.report"]["desired"] == "running" and health["test.ticker"]["state"] == "stopped"
    assert console.node(node).state == "ready"

    inventory = wait_for(lambda: console.inventory(node), 10, "the inventory PUT")
    assert len(inventory["gpus"]) == 8 and len(inventory["nics"]) == 12
    assert sum(a["relation"] == "PIX" for a in inventory["affinity"]) == 8

    refresh = console.enqueue(node, "inventory.refresh")
    health = console.enqueue(node, "node.health")
    wait_for(lambda: done(console, refresh) and done(console, health), 15, "both built-in commands")
    assert console.command(refresh).status == "succeeded"
    assert console.command(refresh).result["format"] == "lockstep.inventory/v1"
    assert console.command(refresh).result["host"]["hostname"] == "node-a"  # LOCKSTEP_HOSTNAME wins
    assert console.command(refresh).result["host"]["os"] == "Red Hat Enterprise Linux 9.4 (Plow)"
    result = console.command(health).result
    assert console.command(health).status == "succeeded" and set(result) == HEALTH_KEYS
    assert result["ok"] is True and result["problems"] == []
    assert [g["temperature_c"] for g in result["gpus"]] == [30, 30, 31, 29, 28, 30, 29, 29]
    assert {n["device"] for n in result["nics"]} >= {"enp25s0np0", "enp218s0np0"}


def test_failing_commands_are_reported_and_the_daemon_keeps_serving(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    ids = {
        "unknown": console.enqueue(node, "gpu.overclock"),
        "bad_args": console.enqueue(node, "test.echo", {"text": "x", "count": "many"}),
        "hang": console.enqueue(node, "test.hang", timeout_s=30),
        "crash": console.enqueue(node, "test.crash"),
    }
    wait_for(lambda: all(done(console, c) for c in ids.values()), 15, "the failing commands")
    errors = {k: (console.command(c).status, console.command(c).error) for k, c in ids.items()}
    assert errors["unknown"][0] == "failed" and "Unknown command type 'gpu.overclock'" in errors["unknown"][1]
    assert errors["bad_args"] == ("failed", "Invalid arguments: argument 'count' must be an integer, not str.")
    assert errors["hang"] == ("failed", "Timed out after 0.3 s; the handler was still running and was abandoned.")
    assert errors["crash"] == ("failed", "Handler crashed: RuntimeError: boom.")
    ok = console.enqueue(node, "test.echo", {"text": "still here"})
    wait_for(lambda: done(console, ok), 10, "a command after the failures")
    assert console.command(ok).status == "succeeded" and console.command(ok).result["text"] == "still here"


def test_a_command_delivered_twice_runs_once(console, start_daemon, tmp_path):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    ran = tmp_path / "ran.log"
    console.inject(r"/result$", 503, times=10**6)  # the console loses every result for now
    cid = console.enqueue(node, "test.record", {"path": str(ran)})
    wait_for(lambda: count_lines(ran, cid) == 1, 10, "the command to run")
    wait_for(lambda: console.requests(r"/result$"), 10, "a result post attempt")
    console.redeliver(cid)  # its lease ends: the console offers it again
    wait_for(lambda: console.command(cid).deliveries == 2, 10, "the second delivery")
    wait_for(lambda: running.daemon.runner.duplicates == 1, 10, "the agent to recognise the duplicate")
    console.clear_faults()
    wait_for(lambda: console.command(cid).state == "succeeded", 10, "the stored result to arrive")
    assert count_lines(ran, cid) == 1
    assert console.command(cid).attempt == 2 and console.command(cid).result == {"recorded": cid}


def test_a_command_delivered_again_after_a_restart_runs_once(console, start_daemon, tmp_path):
    state = tmp_path / "state"
    first = start_daemon(console, state_dir=state, enroll_token=console.create_token())
    node = node_of(first)
    ran = tmp_path / "ran.log"
    console.inject(r"/result$", 503, times=10**6)
    cid = console.enqueue(node, "test.record", {"path": str(ran)})
    wait_for(lambda: count_lines(ran, cid) == 1, 10, "the command to run")
    assert first.stop() == 0
    console.redeliver(cid)
    second = start_daemon(console, state_dir=state)  # same state, no token: the credential is stored
    assert node_of(second) == node
    wait_for(lambda: console.command(cid).deliveries == 2, 10, "the second delivery")
    wait_for(lambda: second.daemon.runner.duplicates == 1, 10, "the agent to recognise the duplicate")
    console.clear_faults()
    wait_for(lambda: console.command(cid).state == "succeeded", 10, "the result after the restart")
    assert count_lines(ran, cid) == 1
    assert console.command(cid).deliveries == 2


def test_console_outage_backoff_no_rerun_and_telemetry_in_order(console, start_daemon, tmp_path, monkeypatch):
    unreachable = []
    real_request = agent_client.Client._request

    def counting(self, *args, **kwargs):
        try:
            return real_request(self, *args, **kwargs)
        except agent_client.Unreachable:
            unreachable.append(time.monotonic())
            raise

    monkeypatch.setattr(agent_client.Client, "_request", counting)
    ceilings = []
    real_next = Backoff.next_delay

    def recording(self):
        ceilings.append(self.ceiling())
        return real_next(self)

    monkeypatch.setattr(Backoff, "next_delay", recording)

    running = start_daemon(console, enroll_token=console.create_token(), telemetry_buffer_bytes="16K",
                           backoff_max_s="0.4")
    node = node_of(running)
    wait_for(lambda: console.heartbeats(node), 10, "a heartbeat")
    ran = tmp_path / "ran.log"

    console.stop()
    outage_started = time.monotonic()
    ids = [console.enqueue(node, "test.record", {"path": str(ran)}) for _ in range(3)]
    emitted = 1000
    for i in range(emitted):
        telemetry.emit("test.sample", {"i": i, "pad": "x" * 20})
    stats = running.daemon.buffer.stats()
    assert stats["dropped_total"] > 0 and stats["bytes"] <= 16 * 1024
    wait_for(lambda: len(unreachable) >= 12, 20, "the agent to notice the outage")
    wait_for(lambda: max(ceilings, default=0) == 0.4, 20, "the backoff to reach its cap")
    outage = time.monotonic() - outage_started
    assert len(unreachable) / outage < 60, "the agent hammers the console while it is down"

    console.start()
    wait_for(lambda: all(console.command(c).state == "succeeded" for c in ids), 20, "the commands after the outage")
    assert all(count_lines(ran, c) == 1 for c in ids)

    def all_telemetry_accounted() -> bool:
        got = [r for r in console.telemetry_records(node) if r["kind"] == "test.sample"]
        return len(got) + console.dropped(node) == emitted

    wait_for(all_telemetry_accounted, 20, "every record to arrive or be counted as dropped")
    received = [r["data"]["i"] for r in console.telemetry_records(node) if r["kind"] == "test.sample"]
    assert received == sorted(set(received)), "telemetry arrived out of order or twice"
    missing = sorted(set(range(emitted)) - set(received))
    assert len(missing) == console.dropped(node) == running.daemon.buffer.stats()["dropped_total"] > 0
    batches = console.telemetry_batches(node)
    assert [b["seq"] for b in batches] == list(range(1, len(batches) + 1))
    # At most one batch was formed during the outage (the one being retried, never dropped);
    # everything after it is the newest records without a gap: the drops were the oldest.
    assert len(batches) >= 3  # batches are at most a quarter of the 16K bound
    rest = received[batches[0]["count"]:]
    assert rest == list(range(rest[0], emitted)), "the newest records did not all arrive"
    assert all(m < rest[0] for m in missing), "a newer record was dropped while an older one was kept"
    wait_for(lambda: any(h.get("telemetry_dropped") == len(missing) for h in console.heartbeats(node)), 10,
             "a heartbeat that reports the drops")


def test_a_lost_telemetry_answer_is_a_harmless_duplicate(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    console.inject(r"/telemetry$", "drop_after", times=1)  # stored, but the answer is lost
    for i in range(5):
        telemetry.emit("test.sample", {"i": i})
    wait_for(lambda: console.duplicates.get(node) == 1, 15, "the retried batch")
    assert [r["data"]["i"] for r in console.telemetry_records(node)] == [0, 1, 2, 3, 4]
    assert [b["seq"] for b in console.telemetry_batches(node)] == [1]


def test_a_busy_console_is_not_asked_again_before_its_retry_after(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token(), backoff_max_s="5")
    node = node_of(running)
    console.inject(r"/telemetry$", 503, times=1, retry_after=2)
    telemetry.emit("test.sample", {"i": 0})
    wait_for(lambda: console.telemetry_records(node), 15, "the batch after the busy answer")
    (busy, *_), (stored, *_) = [r for r in console.requests(r"/telemetry$")][:2]
    assert stored - busy >= 2.0, f"asked again {stored - busy:.2f} s after a 503 with Retry-After: 2"


def test_revoked_credential_stops_traffic_until_reenrolled(console, start_daemon, tmp_path, capsys):
    state = tmp_path / "state"
    running = start_daemon(console, state_dir=state, enroll_token=console.create_token())
    node = node_of(running)
    wait_for(lambda: console.heartbeats(node), 10, "a heartbeat")
    console.revoke_credential(node)
    wait_for(lambda: running.daemon.halted() == "node_credential_invalid", 10, "the agent to halt")
    before = len(console.requests())
    measurement_window(2.0)
    # at most the long poll that was already in flight ends (with a 401); nothing new starts
    assert len(console.requests()) - before <= 1, "the agent keeps calling the console with a revoked credential"

    token = tmp_path / "token"
    token.write_text(console.create_token() + "\n")
    code = main(["enroll", "--console", console.url, "--token-file", str(token), "--state-dir", str(state),
                 "--hostname", "node-a", "--machine-id", "machine-a"])
    assert code == 0, capsys.readouterr().err
    beats = len(console.heartbeats(node))
    wait_for(lambda: len(console.heartbeats(node)) > beats + 1, 15, "heartbeats with the new credential")
    assert running.daemon.halted() is None


def test_retired_node_halts(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    console.retire(node)
    wait_for(lambda: running.daemon.halted() == "node_retired", 10, "the agent to halt")


def test_a_result_larger_than_the_bound_is_replaced_by_a_failure(console, start_daemon):
    console.max_batch_bytes = 8192
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    cid = console.enqueue(node, "test.echo", {"text": "x" * 9000})
    wait_for(lambda: done(console, cid), 15, "the command")
    assert console.command(cid).status == "failed"
    assert "larger than the console accepts" in console.command(cid).error


LOG_LINE = re.compile(r'^ts=\S+Z level=(debug|info|warning|error) event=[\w.]+( \w+=("([^"\\]|\\.)*"|\S*))*$')


def test_sigterm_stops_cleanly_and_a_restart_runs_nothing_twice(console, agent_process, tmp_path):
    state = tmp_path / "state"
    env = dict(console_url=console.url, state_dir=state, hostname="node-s", machine_id="m-s",
               command_modules="agent_test_commands", backoff_max_s="0.5", shutdown_grace_s="0.5",
               health_interval_s="3600", log_level="debug")
    proc = agent_process("run", enroll_token=console.create_token(), **env)
    node = wait_for(lambda: console.node_by_name("node-s"), 20, "the node to enroll").id
    wait_for(lambda: console.heartbeats(node), 20, "a heartbeat")

    ran = tmp_path / "ran.log"
    console.inject(r"/result$", 503, times=10**6)
    record = console.enqueue(node, "test.record", {"path": str(ran)})
    sleeper = console.enqueue(node, "test.sleep", {"seconds": 60}, timeout_s=120)
    wait_for(lambda: count_lines(ran, record) == 1, 20, "the record command to run")
    wait_for(lambda: f"event=command.start id={sleeper}" in proc.log_path.read_text(), 20, "the sleeper to start")

    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert time.monotonic() - stopped_at < 10
    log = proc.log_path.read_text().splitlines()
    assert log and all(LOG_LINE.match(line) for line in log), [ln for ln in log if not LOG_LINE.match(ln)][:3]
    assert any("event=agent.stopped" in line for line in log)
    assert any(f"event=command.abandoned id={sleeper}" in line for line in log)

    console.redeliver(record)
    again = agent_process("run", **env)
    wait_for(lambda: console.command(record).deliveries == 2, 20, "the second delivery")
    wait_for(lambda: f"event=command.duplicate id={record}" in again.log_path.read_text(), 20, "the duplicate")
    console.clear_faults()
    wait_for(lambda: console.command(record).state == "succeeded", 20, "the stored result after the restart")
    wait_for(lambda: console.command(sleeper).state == "failed", 20, "the abandoned command's failure")
    assert "shut down before this command finished" in console.command(sleeper).error
    assert count_lines(ran, record) == 1
    assert console.command(record).deliveries == 2
    again.send_signal(signal.SIGTERM)
    assert again.wait(timeout=20) == 0


def test_run_without_credential_or_token_exits_2(agent_process, tmp_path):
    proc = agent_process("run", state_dir=tmp_path / "state")
    assert proc.wait(timeout=30) == 2
    assert "python -m agent enroll" in proc.log_path.read_text()
    bad = agent_process("run", state_dir=tmp_path / "state", cluster_id="seven")
    assert bad.wait(timeout=30) == 2
    assert "LOCKSTEP_CLUSTER_ID='seven' is not an integer" in bad.log_path.read_text()


def test_version_and_inventory_entry_points(agent_process):
    proc = agent_process("version")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.strip() == "lockstep-agent 0.1.0"
