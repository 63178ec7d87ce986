"""Command types and activities for the agent tests (LOCKSTEP_COMMAND_MODULES=agent_test_commands).

``test.record`` appends "<command id> <attempt>" to a file: the tests count how
many times a command really ran, across agent restarts. The activities write one line per
start (``start <label>``) and per round (``tick <label>``) to their ``path``, so the tests see
from outside the process what ran, with which plan, and how often it was started.
"""

from __future__ import annotations

import os
import threading

from agent.activities import ActivityRegistry, default_activities
from agent.commands import Arg, CommandContext, Registry, default_registry

_forever = threading.Event()


def record(args: dict, ctx: CommandContext) -> dict:
    with open(args["path"], "a") as fh:
        fh.write(f"{ctx.command_id} {ctx.attempt}\n")
        fh.flush()
        os.fsync(fh.fileno())
    if args["sleep_s"]:
        ctx.cancelled.wait(args["sleep_s"])
    return {"recorded": ctx.command_id}


def sleep(args: dict, ctx: CommandContext) -> dict:
    finished = not ctx.cancelled.wait(args["seconds"])
    return {"slept": args["seconds"], "finished": finished}


def hang(args: dict, ctx: CommandContext) -> dict:
    _forever.wait()  # ignores ctx.cancelled on purpose: a handler stuck in C code
    return {}


def crash(args: dict, ctx: CommandContext) -> dict:
    raise RuntimeError("boom")


def echo(args: dict, ctx: CommandContext) -> dict:
    return {"text": args["text"] * args["count"], "tags": args["tags"], "mode": args["mode"]}


def emit(args: dict, ctx: CommandContext) -> dict:
    for i in range(args["count"]):
        ctx.emit("test.sample", {"i": i, "command": ctx.command_id})
    return {"emitted": args["count"]}


def not_an_object(args: dict, ctx: CommandContext) -> list:
    return [1, 2, 3]


def not_json(args: dict, ctx: CommandContext) -> dict:
    return {"value": object()}


def register(registry: Registry) -> Registry:
    registry.register("test.record", timeout_s=30, args={
        "path": Arg(str, required=True), "sleep_s": Arg(float, default=0.0, min=0)})(record)
    registry.register("test.sleep", timeout_s=60, args={"seconds": Arg(float, required=True, min=0)})(sleep)
    registry.register("test.hang", timeout_s=0.3)(hang)
    registry.register("test.crash", timeout_s=5)(crash)
    registry.register("test.echo", timeout_s=5, args={
        "text": Arg(str, required=True, max_len=100000),
        "count": Arg(int, default=1, min=1, max=1000),
        "tags": Arg(list, items=str, default=[]),
        "mode": Arg(str, choices=("fast", "slow"), default="fast"),
    })(echo)
    registry.register("test.emit", timeout_s=10, args={"count": Arg(int, required=True, min=1)})(emit)
    registry.register("test.not_object", timeout_s=5)(not_an_object)
    registry.register("test.not_json", timeout_s=5)(not_json)
    return registry


def _line(path: str, text: str) -> None:
    if path:
        with open(path, "a") as fh:
            fh.write(text + "\n")


def ticker(ctx) -> None:
    _line(ctx.plan["path"], f"start {ctx.plan['label']}")
    ticks = 0
    while ctx.running():
        plan = ctx.plan
        ticks += 1
        _line(plan["path"], f"tick {plan['label']}")
        ctx.progress(ticks=ticks, label=plan["label"])
        ctx.sleep(plan["interval_s"])


def crasher(ctx) -> None:
    _line(ctx.plan["path"], "start crasher")
    for _ in range(ctx.plan["rounds"]):
        if not ctx.sleep(0.01):
            return
    raise RuntimeError("boom")


ACTIVITY_ARGS = {
    "interval_s": Arg(float, default=0.05, min=0.001, max=60),
    "label": Arg(str, default="a", max_len=40),
    "path": Arg(str, default=""),
}


def register_activities(registry: ActivityRegistry) -> ActivityRegistry:
    registry.register("test.ticker", args=ACTIVITY_ARGS, description="Writes a line per round.")(ticker)
    registry.register("test.crasher", args={"rounds": Arg(int, default=0, min=0), "path": Arg(str, default="")},
                      description="Crashes after some rounds.")(crasher)
    return registry


register(default_registry)
register_activities(default_activities)
