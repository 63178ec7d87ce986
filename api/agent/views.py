"""The agent endpoints (docs/agent-protocol.md): small, async, one transaction each.

They are plain async Django views rather than DRF views: they sit on the hot path of every
node, hold long polls open by the thousand, and do their database work on a bounded thread
pool (`console.core.asyncdb`) so one console process serves many agents at once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math

from django.conf import settings
from django.http import JsonResponse
from django.utils import timezone

from api.agent.auth import AgentError, node_for_credential
from console.commands import dispatch, wakeup
from console.core.asyncdb import LoopSlots, NoSlot, run_db, run_db_for_delivery
from console.fleet import enrollment, lifecycle
from console.fleet.inventory import InventoryError, apply_inventory
from console.telemetry.ingest import BatchInvalid, BatchTooLarge, ingest

ENROLL_MAX_BYTES = 64 * 1024
HEARTBEAT_MAX_BYTES = 64 * 1024
HEARTBEAT_FIELDS = ("uptime_s", "telemetry_buffered", "telemetry_dropped", "commands_running")
HEARTBEAT_MAX_ACTIVITIES = 64
# Telemetry yields to control: a flood of batches waits here, on the event loop, instead of taking
# every database thread (and most of the process's CPU) from polls, heartbeats and results; one
# that waits too long is answered 503 and sent again later. Agents keep unaccepted batches on
# disk, so a slower or refused answer loses nothing.
TELEMETRY_SLOTS = LoopSlots(settings.LOCKSTEP["TELEMETRY_CONCURRENCY"])
TELEMETRY_RETRY_AFTER_S = 10


def agent_endpoint(*methods: str):
    """Method check, and AgentError → its JSON answer, for an async agent view."""

    def decorate(view):
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            if request.method not in methods:
                return JsonResponse(
                    {"error": "method_not_allowed", "detail": f"Use {' or '.join(methods)}."},
                    status=405, headers={"Allow": ", ".join(methods)},
                )
            try:
                return await view(request, *args, **kwargs)
            except AgentError as exc:
                return JsonResponse(exc.body(), status=exc.status, headers=exc.headers)

        wrapper.csrf_exempt = True
        return wrapper

    return decorate


def read_json(request, max_bytes: int, *, required: bool = True):
    declared = request.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise AgentError("batch_too_large", f"The body is {declared} bytes; the limit is {max_bytes}.", 413)
    body = request.body
    if len(body) > max_bytes:
        raise AgentError("batch_too_large", f"The body is {len(body)} bytes; the limit is {max_bytes}.", 413)
    if not body:
        if required:
            raise AgentError("invalid", "The body is empty; send a JSON object.", 400)
        return {}
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AgentError("invalid", f"The body is not JSON: {exc}", 400) from None
    if not isinstance(payload, dict):
        raise AgentError("invalid", "The body must be a JSON object.", 400)
    return payload


def _seen(authorization: str, touch: bool = True):
    node = node_for_credential(authorization)
    if touch or node.state in lifecycle.CONTACT_REVIVES:
        return lifecycle.mark_seen(node)
    return node


def _authenticated(authorization: str, work, args: tuple):
    if work is None:
        return _seen(authorization)
    # Work that writes last_seen itself spares mark_seen's own UPDATE.
    node = _seen(authorization, touch=not getattr(work, "touches_last_seen", False))
    return work(node, *args)


async def authenticate(request, work=None, *args):
    """The node of the request's credential, marked seen; with `work`, `work(node, *args)` runs
    right after authentication on the same trip to the database thread pool (one hop per
    request, not two) and its result is returned instead."""
    return await run_db(_authenticated, request.headers.get("Authorization", ""), work, args)


@agent_endpoint("POST")
async def enroll(request):
    payload = read_json(request, ENROLL_MAX_BYTES)
    try:
        result = await run_db(enrollment.enroll, payload.get("token"), payload.get("host"), payload.get("cluster_id"))
    except enrollment.EnrollmentRefused as exc:
        raise AgentError(exc.code, exc.detail, exc.status, exc.field) from None
    node, limits = result.node, settings.LOCKSTEP
    return JsonResponse(
        {
            "node_id": node.pk,
            "node_name": node.name,
            "cluster_id": node.cluster_id,
            "organization_id": node.organization_id,
            "credential": result.credential,
            "heartbeat_interval_s": limits["AGENT_HEARTBEAT_INTERVAL_S"],
            "poll_wait_s": max(1, limits["AGENT_POLL_MAX_WAIT_S"] - 5),
            "telemetry_max_batch_bytes": limits["TELEMETRY_MAX_BATCH_BYTES"],
            "telemetry_max_records": limits["TELEMETRY_MAX_RECORDS"],
        },
        status=201,
    )


def _store_heartbeat(node, request):
    from console.fleet.models import Node

    payload = read_json(request, HEARTBEAT_MAX_BYTES, required=False)
    status = {key: payload[key] for key in HEARTBEAT_FIELDS
              if isinstance(payload.get(key), (int, float)) and not isinstance(payload.get(key), bool)}
    activities = payload.get("activities")  # the agent's activity health (the body is bounded above)
    if isinstance(activities, list):
        status["activities"] = [a for a in activities[:HEARTBEAT_MAX_ACTIVITIES]
                                if isinstance(a, dict) and isinstance(a.get("name"), str)]
    now = timezone.now()
    fields = {"agent_status": status, "last_seen": now}  # one UPDATE: status and "seen"
    version = payload.get("agent_version")
    if isinstance(version, str) and version != node.agent_version:
        fields["agent_version"] = version[:50]
    Node.objects.filter(pk=node.pk).update(**fields)
    return node.state, now


_store_heartbeat.touches_last_seen = True


@agent_endpoint("POST")
async def heartbeat(request):
    state, now = await authenticate(request, _store_heartbeat, request)
    return JsonResponse({"node_state": state, "server_time": now.isoformat()})


def _int_param(request, name: str, default: int, low: int, high: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise AgentError("invalid", f"Query parameter {name}={raw!r} is not a number.", 400, name) from None
    if math.isnan(value):
        raise AgentError("invalid", f"Query parameter {name} is not a number.", 400, name)
    return int(min(max(value, low), high))


def command_json(command) -> dict:
    return {
        "id": str(command.pk),
        "type": command.type,
        "args": command.args,
        "timeout_s": command.timeout_s,
        "attempt": command.attempt,
        "issued_at": command.created.isoformat(),
    }


@agent_endpoint("GET")
async def poll_commands(request):
    limits = settings.LOCKSTEP
    wait = _int_param(request, "wait", 25, 0, limits["AGENT_POLL_MAX_WAIT_S"])
    batch = _int_param(request, "max", 10, 1, 100)
    node = await authenticate(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    # Listen before the first look, so a command queued in between still wakes this poll.
    async with wakeup.listen(node.pk) as woken:
        commands = await run_db_for_delivery(dispatch.claim, node.pk, batch)
        while not commands:
            # Woken by a command queued for this node, or by the periodic sweep that finds work
            # whose wake-up was missed (console/commands/wakeup.py). A wait that ends quietly
            # answers empty: the agent polls again at once, and that poll's claim sees the rest.
            remaining = deadline - loop.time()
            if remaining <= 0 or not await woken.wait(remaining):
                break
            commands = await run_db_for_delivery(dispatch.claim, node.pk, batch)
    return JsonResponse({"commands": [command_json(c) for c in commands]})


def _record_result(node, request, command_id):
    payload = read_json(request, settings.LOCKSTEP["TELEMETRY_MAX_BATCH_BYTES"])
    status = payload.get("status")
    if status not in ("succeeded", "failed"):
        raise AgentError("invalid", f"status must be 'succeeded' or 'failed', got {status!r}.", 400, "status")
    error = payload.get("error", "")
    if not isinstance(error, str):
        raise AgentError("invalid", "error must be a string.", 400, "error")
    return dispatch.record_result(
        node, command_id, succeeded=status == "succeeded", result=payload.get("result"), error=error[:10000],
    )


@agent_endpoint("POST")
async def command_result(request, command_id):
    outcome = await authenticate(request, _record_result, request, command_id)
    if outcome is None:
        raise AgentError("not_found", "No such command for this node.", 404)
    body = {"accepted": outcome.accepted}
    if outcome.reason:
        body["reason"] = outcome.reason
    return JsonResponse(body)


def _ingest(node, request):
    limits = settings.LOCKSTEP
    return ingest(node, read_json(request, limits["TELEMETRY_MAX_BATCH_BYTES"]), limits["TELEMETRY_MAX_RECORDS"])


@agent_endpoint("POST")
async def telemetry(request):
    try:
        async with TELEMETRY_SLOTS.within(settings.LOCKSTEP["TELEMETRY_QUEUE_WAIT_S"]):
            result = await authenticate(request, _ingest, request)
    except NoSlot:
        raise AgentError(
            "busy", "The console is storing other telemetry; keep this batch and send it again later.", 503,
            headers={"Retry-After": str(TELEMETRY_RETRY_AFTER_S)},
        ) from None
    except BatchTooLarge as exc:
        raise AgentError("batch_too_large", str(exc), 413) from None
    except BatchInvalid as exc:
        raise AgentError("invalid", str(exc), 400, exc.field, exc.message) from None
    if result.duplicate:
        return JsonResponse({"accepted": 0, "duplicate": True})
    return JsonResponse({"accepted": result.accepted}, status=202)


def _apply_inventory(node, request):
    return apply_inventory(node, read_json(request, settings.LOCKSTEP["INVENTORY_MAX_BYTES"]))


@agent_endpoint("PUT")
async def inventory(request):
    try:
        counts = await authenticate(request, _apply_inventory, request)
    except InventoryError as exc:
        raise AgentError("invalid", str(exc), 400, exc.field, exc.message) from None
    return JsonResponse(counts)
