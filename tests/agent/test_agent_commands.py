"""The command framework: schemas, the registry, the runner (timeouts, crashes, duplicates)."""

from __future__ import annotations

import threading
import time

import agent_test_commands
import pytest
from agent_testlib import wait_for

from agent.commands import Arg, ArgError, CommandType, Registry, validate_args
from agent.commands.runner import CommandRunner
from agent.commands.store import CommandStore

SCHEMA = {
    "text": Arg(str, required=True, max_len=5),
    "count": Arg(int, default=1, min=1, max=10),
    "ratio": Arg(float, default=0.5, min=0, max=1),
    "tags": Arg(list, items=str, default=[]),
    "mode": Arg(str, choices=("fast", "slow"), default="fast"),
    "dry": Arg(bool, default=False),
}


def test_valid_args_get_defaults():
    assert validate_args(SCHEMA, {"text": "hi", "ratio": 1}) == {
        "text": "hi", "count": 1, "ratio": 1.0, "tags": [], "mode": "fast", "dry": False,
    }
    assert validate_args({}, None) == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "argument 'text' is required"),
        ({"text": 3}, "argument 'text' must be a string, not int"),
        ({"text": "toolong"}, "argument 'text' is longer than 5"),
        ({"text": "a", "count": True}, "argument 'count' must be an integer, not bool"),
        ({"text": "a", "count": 0}, "argument 'count' must be at least 1, not 0"),
        ({"text": "a", "count": 11}, "argument 'count' must be at most 10, not 11"),
        ({"text": "a", "ratio": "x"}, "argument 'ratio' must be a number, not str"),
        ({"text": "a", "tags": ["ok", 2]}, "argument tags[1] must be a string, not int"),
        ({"text": "a", "mode": "turbo"}, "argument 'mode' must be one of 'fast', 'slow', not 'turbo'"),
        ({"text": "a", "colour": "red"}, "unknown argument 'colour'"),
        ([1, 2], "args must be an object, not list"),
    ],
)
def test_arg_errors_name_the_argument(args, message):
    with pytest.raises(ArgError) as info:
        validate_args(SCHEMA, args)
    assert message in str(info.value)


def test_registry_rules():
    reg = Registry()

    @reg.register("feature.do", timeout_s=5, args={"n": Arg(int, required=True)})
    def do(args, ctx):
        return {}

    assert reg.names() == ["feature.do"]
    assert reg.describe()[0]["args"] == {"n": {"type": "int", "required": True}}
    with pytest.raises(ValueError, match="already registered"):
        reg.add(CommandType("feature.do", lambda a, c: {}, {}, 5))
    with pytest.raises(ValueError, match="dotted lowercase"):
        reg.add(CommandType("Bad Name", do, {}, 5))
    with pytest.raises(ValueError, match="timeout_s"):
        reg.add(CommandType("feature.slow", do, {}, 0))
    with pytest.raises(TypeError):
        Arg(set)


class Harness:
    """A runner over a temporary store; completions are collected."""

    def __init__(self, tmp_path, registry: Registry):
        self.store = CommandStore(tmp_path / "commands", sync=False)
        self.completions: list[tuple[str, bool]] = []
        self.lock = threading.Lock()
        self.runner = CommandRunner(registry, self.store, self._done, workers=2)

    def _done(self, cid: str, force: bool) -> None:
        with self.lock:
            self.completions.append((cid, force))

    def run(self, cid: str, ctype: str, args: dict | None = None, timeout_s: float = 30, wait: float = 10) -> dict:
        outcome = self.runner.submit({"id": cid, "type": ctype, "args": args or {}, "timeout_s": timeout_s, "attempt": 1})
        assert outcome == "queued"
        return wait_for(lambda: self.store.completed(cid), wait, f"command {cid} to complete")


@pytest.fixture
def harness(tmp_path):
    reg = agent_test_commands.register(Registry())
    h = Harness(tmp_path, reg)
    yield h
    h.runner.shutdown(0)


def test_unknown_type_fails_with_a_sentence(harness):
    rec = harness.run("c1", "gpu.overclock")
    assert rec["status"] == "failed"
    assert rec["error"].startswith("Unknown command type 'gpu.overclock': this agent (version ")
    assert "test.echo" in rec["error"]


def test_bad_args_fail_naming_the_argument(harness):
    rec = harness.run("c2", "test.echo", {"text": "x", "count": 0})
    assert rec["status"] == "failed"
    assert rec["error"] == "Invalid arguments: argument 'count' must be at least 1, not 0."


def test_timeout_crash_and_bad_results_fail_and_the_runner_keeps_serving(harness):
    started = time.monotonic()
    rec = harness.run("hang", "test.hang", timeout_s=30)
    assert time.monotonic() - started < 5
    assert rec["status"] == "failed"
    assert rec["error"] == "Timed out after 0.3 s; the handler was still running and was abandoned."
    assert harness.runner.abandoned == 1

    rec = harness.run("boom", "test.crash")
    assert (rec["status"], rec["error"]) == ("failed", "Handler crashed: RuntimeError: boom.")
    rec = harness.run("list", "test.not_object")
    assert rec["error"] == "The handler returned list, not a JSON object."
    rec = harness.run("obj", "test.not_json")
    assert rec["error"].startswith("The handler's result is not JSON")

    # the console's timeout_s wins when it is shorter than the type's own
    rec = harness.run("short", "test.sleep", {"seconds": 5}, timeout_s=0.2)
    assert rec["error"] == "Timed out after 0.2 s; the handler was still running and was abandoned."

    rec = harness.run("ok", "test.echo", {"text": "ab", "count": 2, "tags": ["x"]})
    assert rec["status"] == "succeeded"
    assert rec["result"] == {"text": "abab", "tags": ["x"], "mode": "fast"}
    assert [c for c, _ in harness.completions] == ["hang", "boom", "list", "obj", "short", "ok"]


def test_a_command_delivered_twice_runs_once(harness, tmp_path):
    log = tmp_path / "ran.log"
    harness.run("dup", "test.record", {"path": str(log)})
    assert harness.runner.submit({"id": "dup", "type": "test.record", "args": {"path": str(log)}}) == "duplicate_completed"
    assert log.read_text().split() == ["dup", "1"]
    assert harness.completions == [("dup", False), ("dup", True)]  # the second one re-posts the stored result

    # delivered again while it is still running: not started twice
    assert harness.runner.submit({"id": "slow", "type": "test.record",
                                  "args": {"path": str(log), "sleep_s": 0.5}}) == "queued"
    wait_for(lambda: harness.store.is_running("slow"), 5, "slow to start")
    assert harness.runner.submit({"id": "slow", "type": "test.record", "args": {"path": str(log)}}) == "duplicate_running"
    wait_for(lambda: harness.store.completed("slow"), 5, "slow to finish")
    assert log.read_text().split().count("slow") == 1
    assert harness.runner.submit({"id": "../etc/passwd", "type": "test.echo"}) == "ignored"


def test_interrupted_command_is_reported_failed_not_rerun(tmp_path):
    store = CommandStore(tmp_path / "commands", sync=False)
    store.mark_running("lost", "test.record", 1)
    assert store.recover() == ["lost"]
    rec = store.completed("lost")
    assert rec["status"] == "failed" and "stopped while this command was running" in rec["error"]
    assert not store.is_running("lost")
    assert [r["id"] for r in store.unposted()] == ["lost"]
    store.mark_posted("lost")
    assert store.unposted() == []
    assert store.prune(retention_s=-1) == 1 and store.completed("lost") is None


def test_shutdown_abandons_running_and_releases_queued(tmp_path):
    reg = agent_test_commands.register(Registry())
    h = Harness(tmp_path, reg)
    h.runner.submit({"id": "long1", "type": "test.sleep", "args": {"seconds": 30}, "timeout_s": 60})
    h.runner.submit({"id": "long2", "type": "test.sleep", "args": {"seconds": 30}, "timeout_s": 60})
    h.runner.submit({"id": "queued", "type": "test.sleep", "args": {"seconds": 30}, "timeout_s": 60})
    wait_for(lambda: h.store.is_running("long1") and h.store.is_running("long2"), 5, "both workers busy")
    abandoned = h.runner.shutdown(0.2)
    assert sorted(abandoned) == ["long1", "long2"]
    assert "shut down before this command finished" in h.store.completed("long1")["error"]
    assert h.store.completed("queued") is None and not h.store.is_running("queued")
    assert h.runner.submit({"id": "late", "type": "test.echo", "args": {"text": "x"}}) == "stopping"
