"""The commands' one writer: issue, claim, complete, cancel and requeue commands.

API views, pages, the demo and features issue commands only through `issue_command`; the agent
endpoints claim and complete them only through `claim` and `record_result`. Everything runs in
the caller's tenant scope (the lease sweep's task runs unscoped).

Claiming is `SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL, so concurrent polls of one node
never receive the same command; on SQLite the transaction takes the write lock at BEGIN
(`transaction_mode=IMMEDIATE`), which serializes claims. A claim is a lease: a command whose
result has not arrived when the lease ends is offered again, up to `max_attempts` deliveries.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from console.commands import registry, wakeup
from console.commands.models import Command, CommandState
from console.core.errors import Conflict
from console.core.metrics import COMMAND_DELIVERY_SECONDS
from console.live.publish import publish

LEASE_GRACE = timedelta(seconds=30)


def issue_command(node, type_name: str, args=None, *, user=None, idempotency_key: str | None = None,
                  timeout_s: int | None = None) -> tuple[Command, bool]:
    """Queue a command for a node. Returns (command, created); a repeated idempotency key
    returns the first command unchanged. Raises Invalid (an unknown type, bad arguments)."""
    from django.conf import settings

    command_type = registry.get(type_name)
    validated = command_type.validate_args(args)
    if idempotency_key:
        existing = Command.objects.filter(node=node, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            command = Command.objects.create(
                organization_id=node.organization_id,
                cluster_id=node.cluster_id,
                node=node,
                type=type_name,
                args=validated,
                timeout_s=timeout_s or command_type.timeout_s,
                max_attempts=settings.LOCKSTEP["COMMAND_MAX_ATTEMPTS"],
                idempotency_key=idempotency_key or None,
                created_by=user if user is not None and user.is_authenticated else None,
            )
            _publish(command)
            transaction.on_commit(lambda: wakeup.notify(node.pk))
    except IntegrityError:
        # A concurrent request with the same idempotency key won the race.
        existing = Command.objects.filter(node=node, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return existing, False
    return command, True


def _work(now):
    """Commands a poll would take: pending ones, and delivered ones whose lease has ended."""
    return Q(state=CommandState.PENDING) | Q(state=CommandState.DELIVERED, lease_expires__lt=now)


def nodes_with_work(node_ids) -> set[int]:
    """Which of these nodes have commands to claim (one query, for the polls' periodic re-check)."""
    return set(
        Command.objects.filter(_work(timezone.now()), node_id__in=list(node_ids))
        .values_list("node_id", flat=True).distinct()
    )


def claim(node_id: int, limit: int) -> list[Command]:
    """Claim up to `limit` pending commands of a node, oldest first, and lease them."""
    now = timezone.now()
    # Most polls find nothing: one plain query answers that, without a locking transaction.
    if not Command.objects.filter(_work(now), node_id=node_id).exists():
        return []
    with transaction.atomic():
        _requeue_expired(Command.objects.filter(node_id=node_id), now)
        commands = list(
            Command.objects.select_for_update(skip_locked=True)
            .filter(node_id=node_id, state=CommandState.PENDING)
            .order_by("created")[:limit]
        )
        for command in commands:
            command.state = CommandState.DELIVERED
            command.attempt += 1
            command.delivered_at = now
            command.lease_expires = now + timedelta(seconds=command.timeout_s) + LEASE_GRACE
            command.updated = now
        Command.objects.bulk_update(commands, ["state", "attempt", "delivered_at", "lease_expires", "updated"])
        for command in commands:
            _publish(command)
    for command in commands:
        if command.attempt == 1:  # issue → first delivery; redeliveries are the lease's business
            COMMAND_DELIVERY_SECONDS.observe(max((now - command.created).total_seconds(), 0.0))
    return commands


def has_pending(node_id: int) -> bool:
    now = timezone.now()
    return Command.objects.filter(node_id=node_id, state=CommandState.PENDING).exists() or (
        Command.objects.filter(node_id=node_id, state=CommandState.DELIVERED, lease_expires__lt=now).exists()
    )


@dataclass(frozen=True)
class ResultOutcome:
    accepted: bool
    reason: str = ""


def record_result(node, command_id, *, succeeded: bool, result, error: str) -> ResultOutcome | None:
    """Store a command's result once. None when the command is not this node's."""
    with transaction.atomic():
        command = Command.objects.select_for_update().filter(pk=command_id, node=node).first()
        if command is None:
            return None
        if command.state in (CommandState.SUCCEEDED, CommandState.FAILED):
            return ResultOutcome(False, "already completed")
        if command.state == CommandState.CANCELLED:
            return ResultOutcome(False, "cancelled")
        command.state = CommandState.SUCCEEDED if succeeded else CommandState.FAILED
        command.result = result
        command.error = error
        command.completed_at = timezone.now()
        command.lease_expires = None
        if succeeded:
            hook = _hook_for(command.type)
            if hook is not None:
                try:
                    with transaction.atomic():
                        hook(command)
                except Exception as exc:  # the agent did its part; record why the console could not
                    command.state = CommandState.FAILED
                    command.error = f"result rejected by the console: {exc}"
        command.save()
        _publish(command)
    return ResultOutcome(True)


def cancel(command: Command) -> Command:
    """Cancel a pending or delivered command (Conflict when it is already final)."""
    updated = Command.objects.filter(pk=command.pk, state__in=[CommandState.PENDING, CommandState.DELIVERED]).update(
        state=CommandState.CANCELLED, completed_at=timezone.now(), lease_expires=None
    )
    command.refresh_from_db()
    if not updated:
        raise Conflict(f"A {command.state} command cannot be cancelled.", field="state")
    _publish(command)
    return command


def requeue_expired() -> int:
    """Offer again, or expire, every delivered command (in the caller's scope) whose lease ended."""
    with transaction.atomic():
        return _requeue_expired(Command.objects.all(), timezone.now())


def _requeue_expired(queryset, now) -> int:
    stale = list(
        queryset.select_for_update(skip_locked=True).filter(
            state=CommandState.DELIVERED, lease_expires__lt=now
        )
    )
    woken = set()
    for command in stale:
        if command.attempt >= command.max_attempts:
            command.state = CommandState.EXPIRED
            command.completed_at = now
            command.error = f"no result after {command.attempt} deliveries"
        else:
            command.state = CommandState.PENDING
            woken.add(command.node_id)
        command.lease_expires = None
        command.updated = now
    Command.objects.bulk_update(stale, ["state", "completed_at", "error", "lease_expires", "updated"])
    for command in stale:
        _publish(command)
    for node_id in woken:
        transaction.on_commit(lambda node_id=node_id: wakeup.notify(node_id))
    return len(stale)


def _hook_for(type_name: str):
    try:
        return registry.get(type_name).on_success
    except registry.UnknownCommandType:
        return None


def _publish(command: Command) -> None:
    publish(
        command.organization_id,
        command.cluster_id,
        "command",
        {
            "id": str(command.pk),
            "node": command.node_id,
            "type": command.type,
            "state": command.state,
            "attempt": command.attempt,
        },
        key=str(command.pk),
    )

