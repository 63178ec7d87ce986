"""The agent's own flows, as activities of the one supervisor.

Essential (``agent.*``: always running, not controlled by commands): heartbeats, the command
long-poll, result posting, the telemetry sender, the local socket and the forwarding of its
events. Controllable and started by default: ``inventory.report`` (re-read the inventory,
send it when it changed) and ``health.report`` (a ``node.health`` telemetry record).

They are thin shells over the daemon (``ctx.services["daemon"]``): its HTTP clients, its
credential and halt state, its telemetry buffer. Each loop has its own HTTP session, so none
waits on another; each request has a timeout; while the console is unreachable each one retries
with exponential backoff and full jitter, capped by ``LOCKSTEP_BACKOFF_MAX_S``.
"""

from __future__ import annotations

import re
from typing import Any

from agent import log as agentlog
from agent.activities.registry import activity
from agent.client import ConsoleError
from agent.commands.registry import Arg
from agent.inventory import fingerprint

INTERVAL = {"interval_s": Arg(float, default=None, min=0.1, max=86400,
                              help="seconds between rounds; null: the agent's configured interval")}


@activity("agent.heartbeat", essential=True, description="Tell the console the node is alive, with the agent's health.")
def heartbeat(ctx) -> None:
    daemon = ctx.services["daemon"]
    client = daemon.client()
    backoff, failures = daemon.new_backoff(), [0]
    try:
        while daemon.wait_ready(ctx):
            body = daemon.heartbeat_body()
            try:
                daemon.sync_client(client).heartbeat(body)
            except ConsoleError as exc:
                daemon.handle_error("heartbeat", exc, backoff, failures, ctx)
                continue
            daemon.recovered("heartbeat", backoff, failures)
            ctx.progress()
            ctx.sleep(float(daemon.cred.heartbeat_interval_s))
    finally:
        client.close()


@activity("agent.commands", essential=True, description="Long-poll the console for commands and run them.")
def poll_commands(ctx) -> None:
    daemon = ctx.services["daemon"]
    client = daemon.client()
    backoff, failures = daemon.new_backoff(), [0]
    polls = 0
    try:
        while daemon.wait_ready(ctx):
            wait = max(0.0, min(30.0, float(daemon.cred.poll_wait_s)))
            try:
                commands = daemon.sync_client(client).poll(wait=wait, max_commands=10)
            except ConsoleError as exc:
                daemon.handle_error("poll", exc, backoff, failures, ctx)
                continue
            daemon.recovered("poll", backoff, failures)
            if not ctx.running():
                return  # claimed but not started: the console offers them again when the lease ends
            for cmd in commands:
                daemon.runner.submit(cmd)
            polls += 1
            ctx.progress(polls=polls)
    finally:
        client.close()


@activity("agent.results", essential=True, description="Post command results until the console has each one.")
def post_results(ctx) -> None:
    ctx.services["daemon"].poster.loop(ctx)


@activity("agent.telemetry", essential=True, description="Send the buffered telemetry in batches, in order.")
def send_telemetry(ctx) -> None:
    daemon = ctx.services["daemon"]
    client = daemon.client()
    backoff, failures = daemon.new_backoff(), [0]
    buf = daemon.buffer
    sent = 0
    try:
        while daemon.wait_ready(ctx):
            batch = buf.next_batch()
            if batch is None:
                buf.wait(max(0.01, buf.due_in(1.0)))
                continue
            data = buf.encode(batch)
            if len(data) > int(daemon.cred.telemetry_max_batch_bytes):
                if not buf.split_head():
                    buf.discard_head("record larger than the console's batch bound")
                continue
            try:
                _, answer = daemon.sync_client(client).post_telemetry(data)
            except ConsoleError as exc:
                if exc.status == 413:
                    if not buf.split_head():
                        buf.discard_head("the console refused a single record as too large")
                    continue
                if exc.status == 400:
                    buf.discard_head(f"refused as malformed: {exc.detail}", _bad_record_index(exc.body))
                    continue
                daemon.handle_error("telemetry", exc, backoff, failures, ctx)
                continue
            daemon.recovered("telemetry", backoff, failures)
            duplicate = isinstance(answer, dict) and answer.get("duplicate")
            agentlog.debug(
                "telemetry.sent", seq=batch["seq"], records=len(batch["records"]), dropped=batch["dropped"],
                duplicate=bool(duplicate),
            )
            buf.ack(batch["seq"])
            sent += 1
            ctx.progress(batches_sent=sent, last_seq=batch["seq"])
    finally:
        client.close()


def _bad_record_index(body: Any) -> int | None:
    fields = body.get("fields") if isinstance(body, dict) else None
    if isinstance(fields, dict):
        for key in fields:
            match = re.match(r"^records\[(\d+)\]", str(key))
            if match:
                return int(match.group(1))
    return None


@activity("inventory.report", autostart=True, args=INTERVAL,
          description="Re-read the inventory every interval and send it when it changed.")
def report_inventory(ctx) -> None:
    daemon = ctx.services["daemon"]
    client = daemon.client(timeout=30.0)
    backoff, failures = daemon.new_backoff(), [0]
    sent: str | None = None
    try:
        while daemon.wait_ready(ctx):
            interval = ctx.plan["interval_s"] or daemon.config.inventory_interval_s
            try:
                document = daemon.collect_inventory()
            except Exception as exc:  # a bad read is reported and retried next round
                agentlog.error("inventory.failed", exc_info=True, error=str(exc))
                ctx.sleep(interval)
                continue
            digest = fingerprint(document)
            if digest != sent:
                try:
                    answer = daemon.sync_client(client).put_inventory(document)
                except ConsoleError as exc:
                    if exc.status in (400, 413):
                        agentlog.error("inventory.refused", status=exc.status, error=exc.code, detail=exc.detail)
                        ctx.sleep(interval)
                        continue
                    daemon.handle_error("inventory", exc, backoff, failures, ctx)
                    continue
                daemon.recovered("inventory", backoff, failures)
                sent = digest
                agentlog.info("inventory.sent", gpus=len(document["gpus"]), nics=len(document["nics"]),
                              answer=answer)
            ctx.progress(gpus=len(document["gpus"]), nics=len(document["nics"]))
            ctx.sleep(interval)
    finally:
        client.close()


@activity("health.report", autostart=True, args=INTERVAL,
          description="Emit a node.health telemetry record every interval.")
def report_health(ctx) -> None:
    daemon = ctx.services["daemon"]
    while ctx.sleep(ctx.plan["interval_s"] or daemon.config.health_interval_s):
        try:
            summary = daemon.health()
            ctx.emit("node.health", summary)
        except Exception as exc:  # one bad read is reported; the next round tries again
            agentlog.error("health.failed", exc_info=True, error=str(exc))
            continue
        ctx.progress(ok=summary["ok"], problems=len(summary["problems"]))


@activity("agent.localsock", essential=True,
          description="The local socket for processes on the node (events, cluster time).")
def local_socket(ctx) -> None:
    from agent.localsock.server import LocalSocketServer

    daemon = ctx.services["daemon"]
    if daemon.config.agent_socket is None:
        agentlog.info("localsock.disabled", msg="LOCKSTEP_AGENT_SOCKET=none: no local socket")
        ctx.stop_event.wait()
        return
    server = LocalSocketServer(daemon.config.agent_socket, daemon.events, daemon.cluster_clock)
    server.bind()
    agentlog.info("localsock.listening", path=str(server.path))
    try:
        while ctx.running():
            server.serve_once(0.25)
            ctx.progress(**server.stats())
    finally:
        server.close()


@activity("agent.events", essential=True,
          description="Forward the local socket's events to the console as event.<kind> telemetry.")
def forward_events(ctx) -> None:
    daemon = ctx.services["daemon"]
    events = daemon.events
    forwarded = rejected = 0
    while ctx.running():
        batch = events.take(256, timeout=0.25)
        for kind, ts, data in batch:
            try:
                ctx.emit(f"event.{kind}", data, ts)
                forwarded += 1
            except (ValueError, OSError) as exc:  # too large for the buffer, or the disk: counted, said sometimes
                rejected += 1
                if rejected == 1 or rejected % 100 == 0:
                    agentlog.warning("localsock.event_rejected", kind=kind, rejected=rejected, error=str(exc))
        if batch:
            ctx.progress(forwarded=forwarded, rejected=rejected, dropped=events.dropped)

