"""The agent endpoints (docs/agent-protocol.md): small, async, one transaction each.

They are plain async Django views rather than DRF views: they sit on the hot path of every
node, hold long polls open by the thousand, and do their database work on a bounded thread
pool (`console.core.asyncdb`) so one console process serves many agents at once.

Tenancy: every request starts with no tenant scope (`agent_endpoint`); the node credential is
looked up across organizations, and everything after it runs in the node's organization
(`authenticate`). Errors are domain errors, answered in the API's one error shape
(`api.errors.error_response`).
"""

from __future__ import annotations

import asyncio
import functools
import math

from django.conf import settings
from django.http import JsonResponse

from api.agent.auth import node_for_credential
from api.errors import error_response
from console.commands import services as commands
from console.commands import wakeup
from console.core import limits, scoping
from console.core.asyncdb import FairSlots, NoSlot, run_db, run_db_for_delivery
from console.core.errors import Busy, DomainError, Invalid, NotFound, TooLarge
from console.core.metrics import POLLS_HELD, TELEMETRY_REJECTS
from console.fleet import services as fleet
from console.telemetry import services as telemetry_store
from console.telemetry.shares import OVER_SHARE_DETAIL, TELEMETRY_SHARES, credential_key

HEARTBEAT_FIELDS = ("uptime_s", "telemetry_buffered", "telemetry_dropped", "commands_running")
HEARTBEAT_MAX_ACTIVITIES = 64
# Telemetry yields to control: a flood of batches waits here, on the event loop, instead of taking
# every database thread (and most of the process's CPU) from polls, heartbeats and results; one
# that waits too long is answered 503 and sent again later. Agents keep unaccepted batches on
# disk, so a slower or refused answer loses nothing.
# Turns go round the organizations: one organization's many waiting batches do not queue another's.
TELEMETRY_SLOTS = FairSlots(settings.LOCKSTEP["TELEMETRY_CONCURRENCY"])
TELEMETRY_RETRY_AFTER_S = 10
# Before a batch waits for a turn, its node must be within its share (console/telemetry/shares.py):
# one node flooding is refused at once, and the others keep their turns.


def agent_endpoint(*methods: str):
    """Method check, no tenant scope until the credential names one, and domain errors → the
    API's error shape, for an async agent view."""

    def decorate(view):
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            if request.method not in methods:
                return JsonResponse(
                    {"error": "method_not_allowed", "detail": f"Use {' or '.join(methods)}."},
                    status=405, headers={"Allow": ", ".join(methods)},
                )
            try:
                with scoping.closed():
                    return await view(request, *args, **kwargs)
            except DomainError as exc:
                return error_response(exc)

        wrapper.csrf_exempt = True
        wrapper.http_methods = methods  # what the route-coverage test reads
        return wrapper

    return decorate


def read_json(request, max_bytes: int, *, required: bool = True):
    declared = request.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise TooLarge(f"The body is {declared} bytes; the limit is {max_bytes}.", code="batch_too_large")
    body = request.body
    if len(body) > max_bytes:
        raise TooLarge(f"The body is {len(body)} bytes; the limit is {max_bytes}.", code="batch_too_large")
    if not body:
        if required:
            raise Invalid("The body is empty; send a JSON object.")
        return {}
    payload = limits.loads(body)  # strict: no NaN, bounded depth, storable text, 64-bit integers
    if not isinstance(payload, dict):
        raise Invalid("The body must be a JSON object.")
    return payload


def _authenticated(authorization: str, work, args: tuple):
    node = node_for_credential(authorization)
    with scoping.for_organization(node.organization_id):
        # Work that writes last_seen itself spares mark_seen's own UPDATE.
        if work is None or not getattr(work, "touches_last_seen", False) or node.state in fleet.CONTACT_REVIVES:
            fleet.mark_seen(node)
        return node if work is None else work(node, *args)


async def authenticate(request, work=None, *args):
    """The node of the request's credential, marked seen; with `work`, `work(node, *args)` runs
    right after authentication, in the node's organization, on the same trip to the database
    thread pool (one hop per request, not two), and its result is returned instead."""
    return await run_db(_authenticated, request.headers.get("Authorization", ""), work, args)


def in_organization_of(node, fn, *args):
    """`fn(*args)` in the node's organization (for database work after `authenticate`)."""
    with scoping.for_organization(node.organization_id):
        return fn(*args)


@agent_endpoint("POST")
async def enroll(request):
    payload = read_json(request, settings.LOCKSTEP["AGENT_BODY_MAX_BYTES"])
    # The token names the organization: the service looks it up, then works in that organization.
    # A re-enrolling agent proves it holds the node's current credential (Authorization: Bearer lsn_...).
    scheme, _, current = request.headers.get("Authorization", "").partition(" ")
    result = await run_db(fleet.enroll, payload.get("token"), payload.get("host"), payload.get("cluster_id"),
                          current.strip() if scheme == "Bearer" else "")
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
    payload = read_json(request, settings.LOCKSTEP["AGENT_BODY_MAX_BYTES"], required=False)
    status = {key: payload[key] for key in HEARTBEAT_FIELDS
              if isinstance(payload.get(key), (int, float)) and not isinstance(payload.get(key), bool)}
    activities = payload.get("activities")  # the agent's activity health (the body is bounded above)
    if isinstance(activities, list):
        status["activities"] = [a for a in activities[:HEARTBEAT_MAX_ACTIVITIES]
                                if isinstance(a, dict) and isinstance(a.get("name"), str)]
    version = payload.get("agent_version")
    now = fleet.record_heartbeat(node, status, version if isinstance(version, str) else None)
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
        raise Invalid(f"Query parameter {name}={raw!r} is not a number.", field=name) from None
    if math.isnan(value):
        raise Invalid(f"Query parameter {name} is not a number.", field=name)
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
    POLLS_HELD.inc()
    try:
        async with wakeup.listen(node.pk) as woken:
            claimed = await run_db_for_delivery(in_organization_of, node, commands.claim, node.pk, batch)
            while not claimed:
                # Woken by a command queued for this node, or by the periodic sweep that finds work
                # whose wake-up was missed (console/commands/wakeup.py). A wait that ends quietly
                # answers empty: the agent polls again at once, and that poll's claim sees the rest.
                remaining = deadline - loop.time()
                if remaining <= 0 or not await woken.wait(remaining):
                    break
                claimed = await run_db_for_delivery(in_organization_of, node, commands.claim, node.pk, batch)
    finally:
        POLLS_HELD.dec()
    return JsonResponse({"commands": [command_json(c) for c in claimed]})


def _record_result(node, request, command_id):
    payload = read_json(request, settings.LOCKSTEP["TELEMETRY_MAX_BATCH_BYTES"])
    status = payload.get("status")
    if status not in ("succeeded", "failed"):
        raise Invalid(f"status must be 'succeeded' or 'failed', got {status!r}.", field="status")
    error = payload.get("error", "")
    if not isinstance(error, str):
        raise Invalid("error must be a string.", field="error")
    return commands.record_result(
        node, command_id, succeeded=status == "succeeded", result=payload.get("result"), error=error[:10000],
    )


@agent_endpoint("POST")
async def command_result(request, command_id):
    outcome = await authenticate(request, _record_result, request, command_id)
    if outcome is None:
        raise NotFound("No such command for this node.")
    body = {"accepted": outcome.accepted}
    if outcome.reason:
        body["reason"] = outcome.reason
    return JsonResponse(body)


def _ingest(node, request):
    limits = settings.LOCKSTEP
    try:
        return telemetry_store.ingest(node, read_json(request, limits["TELEMETRY_MAX_BATCH_BYTES"]),
                                      limits["TELEMETRY_MAX_RECORDS"])
    except DomainError as exc:
        exc.organization_id = node.organization_id  # for the rejects metric
        raise


def _reject_reason(exc: DomainError) -> str:
    if isinstance(exc, telemetry_store.BatchInvalid):
        return exc.reason
    return {"batch_too_large": "too_large", "busy": "busy", "over_share": "over_share",
            "invalid": "invalid"}.get(exc.code, "unauthenticated")


async def _store_within_shares(request):
    node = await authenticate(request)
    wait = TELEMETRY_SHARES.admit(node.pk, len(request.body), asyncio.get_running_loop().time(),
                                  key=credential_key(request.headers.get("Authorization", "")))
    if wait:
        exc = Busy(OVER_SHARE_DETAIL, retry_after_s=max(1, math.ceil(wait)), code="over_share")
        exc.organization_id = node.organization_id
        raise exc
    try:
        async with TELEMETRY_SLOTS.within(node.organization_id, settings.LOCKSTEP["TELEMETRY_QUEUE_WAIT_S"]):
            return await run_db(in_organization_of, node, _ingest, node, request)
    except NoSlot:
        raise Busy("The console is storing other telemetry; keep this batch and send it again later.",
                   retry_after_s=TELEMETRY_RETRY_AFTER_S) from None
    finally:
        TELEMETRY_SHARES.release(node.pk)


@agent_endpoint("POST")
async def telemetry(request):
    try:
        result = await _store_within_shares(request)
    except DomainError as exc:
        TELEMETRY_REJECTS.labels(str(getattr(exc, "organization_id", "")), _reject_reason(exc)).inc()
        raise
    if result.duplicate:
        return JsonResponse({"accepted": 0, "duplicate": True})
    return JsonResponse({"accepted": result.accepted}, status=202)


def _apply_inventory(node, request):
    return fleet.apply_inventory(node, read_json(request, settings.LOCKSTEP["INVENTORY_MAX_BYTES"]))


@agent_endpoint("PUT")
async def inventory(request):
    return JsonResponse(await authenticate(request, _apply_inventory, request))
