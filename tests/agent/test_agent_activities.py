"""Activities: the supervisor (start, stop, re-plan, crash and backoff, health, the stored plan)
on its own, then in the daemon, driven by ``activity.set`` commands from the console."""

from __future__ import annotations

import json
import threading
import time

import agent_test_commands
import pytest
from agent_testlib import wait_for

from agent.activities import ActivityError, ActivityRegistry, DesiredState, Supervisor
from agent.commands import Arg


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def measurement_window(seconds: float) -> None:
    """Let time pass to check that nothing happens in it (not used to synchronise)."""
    time.sleep(seconds)


@pytest.fixture
def activity_types() -> ActivityRegistry:
    return agent_test_commands.register_activities(ActivityRegistry())


@pytest.fixture
def supervise(activity_types, tmp_path):
    made: list[Supervisor] = []

    def make(desired: DesiredState | None = None, **kwargs) -> Supervisor:
        kwargs.setdefault("backoff_base_s", 0.05)
        kwargs.setdefault("backoff_max_s", 0.4)
        sup = Supervisor(activity_types, desired=desired or DesiredState(None), emit=lambda *a: None, **kwargs)
        sup.start()
        made.append(sup)
        return sup

    yield make
    for sup in made:
        assert sup.shutdown(5) == [], "a loop did not stop"


def test_start_replan_and_stop_change_what_runs(supervise, tmp_path):
    log = tmp_path / "ticker.log"
    sup = supervise()
    assert sup.state_of("test.ticker")["state"] == "stopped"

    result = sup.set("test.ticker", "running", {"path": str(log), "label": "a"})
    assert result["applied"] is True and result["changed"] is True
    assert result["desired"] == {"state": "running", "revision": None,
                                 "args": {"path": str(log), "label": "a", "interval_s": 0.05}}
    wait_for(lambda: lines(log).count("tick a") >= 3, 10, "three rounds with plan a")
    assert sup.state_of("test.ticker")["state"] == "running"

    sup.set("test.ticker", "running", {"path": str(log), "label": "b"})  # a new plan, same loop
    wait_for(lambda: "tick b" in lines(log), 10, "a round with plan b")
    assert lines(log).count("start a") == 1 and "start b" not in lines(log), "a re-plan restarted the loop"
    health = sup.state_of("test.ticker")
    assert health["status"]["label"] == "b" and health["status"]["ticks"] >= 4 and health["restarts"] == 0

    sup.set("test.ticker", "stopped")
    wait_for(lambda: sup.state_of("test.ticker")["state"] == "stopped", 10, "the loop to stop")
    ticks = len(lines(log))
    measurement_window(0.3)
    assert len(lines(log)) == ticks, "the loop kept running after it was stopped"
    assert sup.state_of("test.ticker")["desired"] == "stopped"

    sup.set("test.ticker", "running")  # omitted plan: the defaults, a new run
    wait_for(lambda: sup.state_of("test.ticker")["state"] == "running", 10, "the restart")
    assert sup.state_of("test.ticker")["restarts"] == 0  # started on request, not restarted after a crash


def test_the_same_request_twice_changes_nothing_and_older_revisions_are_ignored(supervise, tmp_path):
    log = tmp_path / "ticker.log"
    sup = supervise()
    plan = {"path": str(log), "label": "r"}
    assert sup.set("test.ticker", "running", plan, revision=10)["changed"] is True
    again = sup.set("test.ticker", "running", plan, revision=10)
    assert again["applied"] is True and again["changed"] is False
    late = sup.set("test.ticker", "stopped", revision=9)  # issued before, arrived after
    assert late["applied"] is False and "older than the applied revision 10" in late["reason"]
    wait_for(lambda: lines(log).count("tick r") >= 2, 10, "the loop to keep running")
    assert sup.state_of("test.ticker")["desired"] == "running"
    assert sup.state_of("test.ticker")["revision"] == 10
    assert lines(log).count("start r") == 1


def test_refusals_name_what_is_wrong(supervise, activity_types):
    activity_types.register("agent.clockwork", essential=True)(lambda ctx: ctx.stop_event.wait())
    sup = supervise()
    with pytest.raises(ActivityError, match=r"unknown activity 'clock\.sync': this agent \(version .*\) has "
                                            r"test\.crasher, test\.ticker"):
        sup.set("clock.sync")
    with pytest.raises(ActivityError, match="'agent.clockwork' is essential to the agent"):
        sup.set("agent.clockwork", "stopped")
    with pytest.raises(ActivityError, match="activity 'test.ticker': argument 'interval_s' must be at least 0.001, not 0.0"):
        sup.set("test.ticker", "running", {"interval_s": 0})
    with pytest.raises(ActivityError, match="unknown argument 'colour'"):
        sup.set("test.ticker", "running", {"colour": "red"})
    with pytest.raises(ActivityError, match="state must be 'running' or 'stopped', not 'paused'"):
        sup.set("test.ticker", "paused")
    assert sup.state_of("test.ticker")["desired"] == "stopped"
    wait_for(lambda: sup.state_of("agent.clockwork")["state"] == "running", 10, "the essential one to run")


def test_registry_rules():
    reg = ActivityRegistry()
    with pytest.raises(ValueError, match="dotted lowercase"):
        reg.register("Mesh")(lambda ctx: None)
    with pytest.raises(ValueError, match="essential activities must use one"):
        reg.register("agent.thing")(lambda ctx: None)
    with pytest.raises(ValueError, match="every argument needs a default"):
        reg.register("probe.mesh", args={"peers": Arg(list, required=True)})(lambda ctx: None)
    reg.register("probe.mesh", args={"peers": Arg(list, items=str, default=[])})(loop := lambda ctx: None)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("probe.mesh")(lambda ctx: None)
    reg.register("probe.mesh", args={"peers": Arg(list, items=str, default=[])})(loop)  # the same: fine
    assert reg.describe()[0]["args"] == {"peers": {"type": "list", "required": False, "default": [],
                                                   "items": "str"}}


def test_a_crashing_loop_is_restarted_with_growing_backoff_and_its_error_is_reported(supervise, tmp_path):
    log = tmp_path / "crasher.log"
    starts: list[float] = []
    real_append = agent_test_commands._line

    def timed(path, text):
        if text == "start crasher":
            starts.append(time.monotonic())
        real_append(path, text)

    agent_test_commands._line = timed
    try:
        sup = supervise(backoff_base_s=0.05, backoff_max_s=0.4)
        sup.set("test.crasher", "running", {"path": str(log)})
        wait_for(lambda: len(starts) >= 7, 20, "seven starts of the crashing loop")
        health = wait_for(lambda: (h := sup.state_of("test.crasher")) and h["state"] == "backoff" and h, 10,
                          "the backoff state")
    finally:
        agent_test_commands._line = real_append
    assert health["restarts"] >= 6 and health["desired"] == "running"
    assert health["last_error"] == "RuntimeError: boom" and health["last_error_at"] > time.time() - 30
    assert 0 <= health["retry_in_s"] <= 0.4
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    # equal jitter: the n-th delay is at least half of min(cap, base * 2**n)
    for n, gap in enumerate(gaps[:6]):
        assert gap >= min(0.4, 0.05 * 2**n) / 2, (n, gaps)
    assert gaps[4] >= 0.2 and gaps[5] >= 0.2, gaps  # reached the cap's range

    sup.set("test.crasher", "stopped")  # a stop during the backoff ends it
    wait_for(lambda: sup.state_of("test.crasher")["state"] == "stopped", 10, "the crasher to stop")


def test_a_run_that_made_progress_resets_the_backoff(activity_types):
    calls = {"n": 0}

    def flaky(ctx):
        calls["n"] += 1
        if calls["n"] % 2:
            ctx.progress(run=calls["n"])
        raise OSError("device went away")

    activity_types.register("test.flaky")(flaky)
    sup = Supervisor(activity_types, emit=lambda *a: None, backoff_base_s=0.02, backoff_max_s=5)
    sup.start()
    try:
        sup.set("test.flaky")
        wait_for(lambda: calls["n"] >= 10, 20, "ten runs")
        health = sup.state_of("test.flaky")
        assert health["last_error"] == "OSError: device went away" and health["status"]["run"] >= 7
        # every other run made progress: the backoff never grows past its second step
        assert sup._slots["test.flaky"].backoff.failures <= 2
    finally:
        assert sup.shutdown(5) == []


def test_a_loop_without_progress_is_reported_stalled(activity_types):
    activity_types.register("test.stuck", stall_after_s=0.2)(lambda ctx: ctx.stop_event.wait())
    sup = Supervisor(activity_types, emit=lambda *a: None)
    sup.start()
    try:
        sup.set("test.stuck")
        wait_for(lambda: sup.state_of("test.stuck")["state"] == "stalled", 10, "the stall to show")
    finally:
        assert sup.shutdown(5) == []


def test_a_start_while_the_loop_is_still_stopping_waits_for_it(activity_types):
    release = threading.Event()
    runs = []

    def slow_to_stop(ctx):
        runs.append(ctx.plan["n"])
        ctx.stop_event.wait()
        release.wait(10)  # cleans up slowly after the stop

    activity_types.register("test.slow", args={"n": Arg(int, default=0)})(slow_to_stop)
    sup = Supervisor(activity_types, emit=lambda *a: None)
    sup.start()
    try:
        sup.set("test.slow", "running", {"n": 1})
        wait_for(lambda: runs == [1], 10, "the first run")
        sup.set("test.slow", "stopped")
        assert sup.state_of("test.slow")["state"] == "stopping"
        sup.set("test.slow", "running", {"n": 2})
        measurement_window(0.3)
        assert runs == [1], "a second instance started while the first was still running"
        release.set()
        wait_for(lambda: runs == [1, 2], 10, "the second run, after the first returned")
    finally:
        release.set()
        assert sup.shutdown(5) == []


def test_the_desired_state_survives_a_restart(activity_types, tmp_path):
    path = tmp_path / "activities.json"
    log = tmp_path / "ticker.log"
    first = Supervisor(activity_types, desired=DesiredState(path), emit=lambda *a: None)
    first.start()
    first.set("test.ticker", "running", {"path": str(log), "label": "kept"}, revision=5)
    first.set("test.crasher", "stopped")
    wait_for(lambda: "tick kept" in lines(log), 10, "the first run")
    assert first.shutdown(5) == []
    assert path.stat().st_mode & 0o777 == 0o600
    stored = json.loads(path.read_text())["activities"]
    assert stored["test.ticker"]["args"] == {"path": str(log), "label": "kept", "interval_s": 0.05}

    second = Supervisor(activity_types, desired=DesiredState(path), emit=lambda *a: None)
    second.start()
    try:
        wait_for(lambda: lines(log).count("start kept") == 2, 10, "the plan to run again after the restart")
        assert second.state_of("test.ticker")["revision"] == 5
        assert second.state_of("test.crasher")["state"] == "stopped"
        assert second.set("test.ticker", "stopped", revision=4)["applied"] is False  # the stored revision holds
    finally:
        assert second.shutdown(5) == []


def test_a_damaged_plan_file_falls_back_to_the_defaults(activity_types, tmp_path):
    path = tmp_path / "activities.json"
    path.write_text("{not json")
    desired = DesiredState(path)
    assert desired.load_error and "cannot be read" in desired.load_error
    assert (tmp_path / "activities.json.damaged").read_text() == "{not json"
    sup = Supervisor(activity_types, desired=desired, emit=lambda *a: None)
    sup.start()
    try:
        assert sup.state_of("test.ticker")["state"] == "stopped"
        sup.set("test.ticker", "stopped")
        assert json.loads(path.read_text())["activities"]["test.ticker"]["state"] == "stopped"
    finally:
        sup.shutdown(5)


def test_an_activity_stored_but_no_longer_shipped_is_reported_unavailable(activity_types, tmp_path):
    path = tmp_path / "activities.json"
    path.write_text(json.dumps({"format": 1, "activities": {
        "probe.mesh": {"state": "running", "args": {}, "revision": 1}}}))
    sup = Supervisor(activity_types, desired=DesiredState(path), emit=lambda *a: None)
    sup.start()
    try:
        entry = sup.state_of("probe.mesh")
        assert entry["state"] == "unavailable" and "no such activity in this agent" in entry["last_error"]
    finally:
        sup.shutdown(5)


# -- in the daemon, through the console -------------------------------------------------------


def node_of(running) -> int:
    return running.daemon.cred.node_id


def finished(console, cid: str):
    command = console.command(cid)
    return command if command.state in ("succeeded", "failed") else None


def beat_entry(console, node: int, name: str) -> dict | None:
    beats = console.heartbeats(node)
    return next((a for a in beats[-1].get("activities", []) if a["name"] == name), None) if beats else None


def test_commands_start_replan_and_stop_an_activity_and_heartbeats_carry_its_health(console, start_daemon,
                                                                                      tmp_path):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    log = tmp_path / "ticker.log"

    start = console.enqueue(node, "activity.set", {"name": "test.ticker", "args": {"path": str(log), "label": "a"},
                                                   "revision": 1})
    result = wait_for(lambda: finished(console, start), 15, "activity.set to finish")
    assert result.status == "succeeded", result.error
    assert result.result["applied"] is True and result.result["desired"]["state"] == "running"
    wait_for(lambda: "tick a" in lines(log), 10, "the ticker to run")
    entry = wait_for(lambda: (e := beat_entry(console, node, "test.ticker")) and e["state"] == "running"
                     and e.get("status", {}).get("ticks") and e, 15, "a heartbeat with the ticker's health")
    assert entry["desired"] == "running" and entry["revision"] == 1 and entry["restarts"] == 0
    assert entry["last_progress_at"] > time.time() - 30

    replan = console.enqueue(node, "activity.set", {"name": "test.ticker", "args": {"path": str(log), "label": "b"},
                                                    "revision": 2})
    wait_for(lambda: finished(console, replan), 15, "the re-plan")
    wait_for(lambda: "tick b" in lines(log), 10, "a round with the new plan")
    assert lines(log).count("start a") == 1

    # delivered again (its lease ended before the result arrived): applied once, same answer
    stop = console.enqueue(node, "activity.set", {"name": "test.ticker", "state": "stopped", "revision": 3})
    wait_for(lambda: finished(console, stop), 15, "the stop")
    wait_for(lambda: (e := beat_entry(console, node, "test.ticker")) and e["state"] == "stopped", 15,
             "a heartbeat that shows it stopped")
    stale = console.enqueue(node, "activity.set", {"name": "test.ticker", "args": {"label": "old"}, "revision": 2})
    answer = wait_for(lambda: finished(console, stale), 15, "the out-of-order command")
    assert answer.status == "succeeded" and answer.result["applied"] is False
    assert running.daemon.supervisor.state_of("test.ticker")["desired"] == "stopped"


def test_activity_set_refusals_fail_the_command_with_a_sentence(console, start_daemon):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    ids = {
        "unknown": console.enqueue(node, "activity.set", {"name": "nvml.watch"}),
        "essential": console.enqueue(node, "activity.set", {"name": "agent.heartbeat", "state": "stopped"}),
        "bad_plan": console.enqueue(node, "activity.set", {"name": "test.ticker", "args": {"interval_s": "often"}}),
        "bad_state": console.enqueue(node, "activity.set", {"name": "test.ticker", "state": "paused"}),
    }
    wait_for(lambda: all(finished(console, c) for c in ids.values()), 15, "the refused commands")
    errors = {k: (console.command(c).status, console.command(c).error) for k, c in ids.items()}
    assert errors["unknown"][0] == "failed"
    assert errors["unknown"][1].startswith("Invalid arguments: unknown activity 'nvml.watch': this agent (version ")
    assert "clock.sync, health.report, inventory.report, probe.mesh, test.crasher, test.ticker" in errors["unknown"][1]
    assert errors["essential"] == ("failed", "Invalid arguments: activity 'agent.heartbeat' is essential to the "
                                             "agent: it always runs and is not stopped or re-planned by commands.")
    assert errors["bad_plan"] == ("failed", "Invalid arguments: activity 'test.ticker': argument 'interval_s' must "
                                            "be a number, not str.")
    assert errors["bad_state"][1].startswith("Invalid arguments: argument 'state' must be one of 'running', "
                                             "'stopped'")
    assert running.daemon.supervisor.state_of("agent.heartbeat")["state"] == "running"


def test_a_crashing_activity_restarts_with_backoff_and_the_heartbeat_says_so(console, start_daemon, tmp_path):
    running = start_daemon(console, enroll_token=console.create_token(), backoff_max_s="0.4")
    node = node_of(running)
    log = tmp_path / "crasher.log"
    cid = console.enqueue(node, "activity.set", {"name": "test.crasher", "args": {"rounds": 2, "path": str(log)}})
    wait_for(lambda: finished(console, cid), 15, "activity.set")
    entry = wait_for(lambda: (e := beat_entry(console, node, "test.crasher")) and e["restarts"] >= 3 and e, 20,
                     "a heartbeat with three restarts")
    assert entry["last_error"] == "RuntimeError: boom" and entry["desired"] == "running"
    assert entry["state"] in ("backoff", "running")
    assert lines(log).count("start crasher") >= entry["restarts"]  # one run per crash, at least
    # the rest of the agent is unaffected
    echo = console.enqueue(node, "test.echo", {"text": "fine"})
    assert wait_for(lambda: finished(console, echo), 15, "a command meanwhile").status == "succeeded"


def test_an_essential_flow_that_crashes_is_restarted(console, start_daemon, monkeypatch):
    running = start_daemon(console, enroll_token=console.create_token())
    node = node_of(running)
    wait_for(lambda: console.heartbeats(node), 10, "a heartbeat")
    real = type(running.daemon).heartbeat_body
    calls = {"n": 0}

    def breaks_once(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("stats")
        return real(self)

    monkeypatch.setattr(type(running.daemon), "heartbeat_body", breaks_once)
    entry = wait_for(lambda: (e := beat_entry(console, node, "agent.heartbeat")) and e["restarts"] == 1 and e, 20,
                     "heartbeats again, reporting the restart")
    assert entry["last_error"] == "KeyError: 'stats'" and entry["state"] == "running"


def test_a_restarted_agent_runs_the_activities_the_console_last_asked_for(console, start_daemon, tmp_path):
    state = tmp_path / "state"
    log = tmp_path / "ticker.log"
    first = start_daemon(console, state_dir=state, enroll_token=console.create_token())
    node = node_of(first)
    cid = console.enqueue(node, "activity.set", {"name": "test.ticker", "args": {"path": str(log), "label": "kept"},
                                                 "revision": 7})
    stop_health = console.enqueue(node, "activity.set", {"name": "health.report", "state": "stopped", "revision": 7})
    wait_for(lambda: finished(console, cid) and finished(console, stop_health), 15, "both commands")
    wait_for(lambda: "tick kept" in lines(log), 10, "the ticker")
    assert first.stop() == 0
    commands_before = len(console.requests(r"/commands/.*/result$"))

    second = start_daemon(console, state_dir=state)  # no command this time
    wait_for(lambda: lines(log).count("start kept") == 2, 15, "the ticker to run again after the restart")
    supervisor = second.daemon.supervisor
    assert supervisor.state_of("test.ticker")["revision"] == 7
    assert supervisor.state_of("health.report")["state"] == "stopped"
    # autostart, never told otherwise (its thread may still be starting under load)
    wait_for(lambda: supervisor.state_of("inventory.report")["state"] == "running", 10, "inventory.report to run")
    assert len(console.requests(r"/commands/.*/result$")) == commands_before


def test_the_heartbeats_activity_health_stays_within_its_bound():
    from agent.daemon import HEALTH_MAX_BYTES, bounded_health

    small = [{"name": "agent.heartbeat", "state": "running", "status": {"beats": 3}}]
    assert bounded_health(small) == small
    chatty = [{"name": f"feature.f{i}", "state": "running", "status": {"note": "x" * 900}} for i in range(60)]
    trimmed = bounded_health(chatty)
    assert len(trimmed) == 60 and all("status" not in e for e in trimmed)  # every state kept, statuses dropped
    many = [{"name": f"feature.f{i}", "state": "running", "last_error": "e" * 250} for i in range(400)]
    kept = bounded_health(many)
    assert 0 < len(kept) < 400 and kept == many[:len(kept)]
    assert len(json.dumps(kept, separators=(",", ":"))) <= HEALTH_MAX_BYTES
