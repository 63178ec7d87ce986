"""Telemetry's one writer: validate and store a batch from an agent — all of it, once, or nothing.

Each record's kind must be registered (`console.telemetry.kinds`) and its data must pass the
kind's validator; the batch is then stored in one transaction, deduplicated by `(node, seq)`,
each kind's `file` step runs in that transaction, and after the commit each kind's handlers run
with that kind's records.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone

import orjson
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.core import scoping
from console.core.errors import Invalid, TooLarge
from console.core.metrics import TELEMETRY_BATCHES, TELEMETRY_RECORDS
from console.fleet.models import Node
from console.telemetry import kinds

KIND = re.compile(r"^[a-z0-9_.]{1,64}$")
# Timestamps outside this range are agent clock bugs, not measurements.
TS_MIN, TS_MAX = datetime(2000, 1, 1, tzinfo=dt_timezone.utc), datetime(2100, 1, 1, tzinfo=dt_timezone.utc)
INT64_MAX = 2**63 - 1
Parsed = tuple[str, datetime, dict, str]  # a checked record: kind, ts, data, its JSON


class BatchInvalid(Invalid):
    """A batch refused as malformed; `reason` says how for the metrics (invalid, unknown_kind)."""

    def __init__(self, field: str, message: str, reason: str = "invalid"):
        super().__init__(f"{field}: {message}", field=field, problem=message)
        self.reason = reason


class BatchTooLarge(TooLarge):
    def __init__(self, detail: str):
        super().__init__(detail, code="batch_too_large")


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicate: bool


def _timestamp(value, field: str) -> datetime:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            ts = datetime.fromtimestamp(value, tz=dt_timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise BatchInvalid(field, f"{value!r} is not a valid Unix time") from None
    elif isinstance(value, str):
        try:
            ts = parse_datetime(value)
        except ValueError:  # well-formed but impossible: 2026-02-30, an offset beyond ±24 h
            ts = None
        if ts is None or ts.tzinfo is None:
            raise BatchInvalid(field, f"{value!r} is not ISO 8601 with a time zone")
    else:
        raise BatchInvalid(field, "must be an ISO 8601 string or Unix seconds")
    if not TS_MIN <= ts < TS_MAX:
        raise BatchInvalid(field, f"{value!r} is outside 2000..2100")
    return ts


def _count(payload: dict, key: str, low: int, default=None) -> int:
    value = payload.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= INT64_MAX:
        raise BatchInvalid(key, f"must be an integer in {low}..2^63-1, got {value!r}")
    return value


def parse_batch(payload, max_records: int) -> tuple[int, int, list[Parsed]]:
    """(seq, dropped, [(kind, ts, data, data as JSON)]) or BatchInvalid naming the first bad field."""
    if not isinstance(payload, dict):
        raise BatchInvalid("batch", "must be a JSON object")
    seq = _count(payload, "seq", 1)
    dropped = _count(payload, "dropped", 0, default=0)
    records = payload.get("records")
    if not isinstance(records, list):
        raise BatchInvalid("records", "must be a list")
    if len(records) > max_records:
        raise BatchTooLarge(f"{len(records)} records in one batch; the limit is {max_records}")
    parsed = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise BatchInvalid(f"records[{i}]", "must be an object")
        name = record.get("kind")
        if not isinstance(name, str) or not KIND.match(name):
            raise BatchInvalid(f"records[{i}].kind", f"{name!r} is not a dotted name ([a-z0-9_.], ≤ 64)")
        try:
            kind = kinds.get(name)
        except kinds.UnknownKind as exc:
            raise BatchInvalid(f"records[{i}].kind", exc.detail, reason="unknown_kind") from None
        data = record.get("data", {})
        if not isinstance(data, dict):
            raise BatchInvalid(f"records[{i}].data", "must be an object")
        ts = _timestamp(record.get("ts"), f"records[{i}].ts")
        try:
            data = kind.validate(data)
        except kinds.KindInvalid as exc:
            where = f"records[{i}].data.{exc.field}" if exc.field else f"records[{i}].data"
            raise BatchInvalid(where, exc.problem) from None
        parsed.append((name, ts, data, _encoded(kind, data, f"records[{i}].data")))
    return seq, dropped, parsed


def _encoded(kind: kinds.TelemetryKind, data: dict, where: str) -> str:
    """The record's data as the JSON it is stored as, within the kind's `max_bytes` (UTF-8
    bytes): encoded once, for the check and the insert. orjson writes a number that is not finite
    as null, so a record whose JSON holds a null is encoded again by json, which refuses one; so
    is one orjson cannot encode (an integer beyond 64 bits)."""
    try:
        raw = orjson.dumps(data)
    except TypeError:
        raw = None
    if raw is None or b"null" in raw:
        try:
            raw = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()
        except ValueError:
            raise BatchInvalid(where, "holds a number that is not finite") from None
    if kind.max_bytes is not None and len(raw) > kind.max_bytes:
        raise BatchInvalid(where, f"is {len(raw)} bytes as JSON; at most {kind.max_bytes}")
    return raw.decode()


def ingest(node: Node, payload, max_records: int) -> IngestResult:
    """Store a batch for the node (in the caller's scope: the node's organization)."""
    seq, dropped, records = parse_batch(payload, max_records)
    _check_node(node, records)
    organization = str(node.organization_id)
    scoping.require_writable(node.organization_id, "storing telemetry")
    with transaction.atomic():
        stored = _store(node, seq, dropped, records)
        if stored is not None:
            groups = _by_kind(node, seq, *stored, records)
            kinds.file_in_batch(groups)
            transaction.on_commit(lambda: kinds.run_handlers(groups))
    if stored is None:  # the same batch, sent again (or retried concurrently), was stored first
        TELEMETRY_BATCHES.labels(organization, "duplicate").inc()
        return IngestResult(0, True)
    TELEMETRY_BATCHES.labels(organization, "stored").inc()
    for group in groups:
        TELEMETRY_RECORDS.labels(organization, group.kind).inc(len(group.records))
    return IngestResult(len(records), False)


# The hot path of every agent's batch, in a few plain statements rather than the ORM's (whose
# building of each statement cost more CPU than the database's running it): the batch row, or
# nothing when the node's seq was stored already; its records; the node's counters. The rows'
# placement is the node's own (organization, cluster, node), the scope checked by the caller.
_INSERT_BATCH = ("INSERT INTO telemetry_telemetrybatch (created, updated, organization_id, cluster_id, node_id, seq, "
                 "record_count, dropped) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                 "ON CONFLICT (node_id, seq) DO NOTHING RETURNING id")
_INSERT_RECORDS = ("INSERT INTO telemetry_telemetryrecord (created, updated, organization_id, cluster_id, node_id, "
                   "batch_id, kind, ts, data) VALUES ")
_RECORD_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_RECORDS_PER_INSERT = 100  # nine parameters a row: within SQLite's 999 on old builds
_UPDATE_NODE = ("UPDATE fleet_node SET telemetry_dropped = telemetry_dropped + %s, "
                "telemetry_seq = CASE WHEN telemetry_seq > %s THEN telemetry_seq ELSE %s END "
                "WHERE organization_id = %s AND id = %s")


def _store(node: Node, seq: int, dropped: int, records: list[Parsed]) -> tuple[int, list[int]] | None:
    """(batch id, record ids) of the stored batch, or None when (node, seq) was stored before."""
    ops = connection.ops
    now = ops.adapt_datetimefield_value(timezone.now())
    placement = (node.organization_id, node.cluster_id, node.pk)
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_BATCH, [now, now, *placement, seq, len(records), dropped])
        row = cursor.fetchone()
        if row is None:
            return None
        batch_id, ids = row[0], []
        for start in range(0, len(records), _RECORDS_PER_INSERT):
            chunk = records[start:start + _RECORDS_PER_INSERT]
            params = []
            for kind, ts, _data, text in chunk:
                params += [now, now, *placement, batch_id, kind, ops.adapt_datetimefield_value(ts), text]
            cursor.execute(_INSERT_RECORDS + ", ".join([_RECORD_ROW] * len(chunk)) + " RETURNING id", params)
            ids += [r[0] for r in cursor.fetchall()]  # in the rows' order, as Django's bulk_create relies on
        cursor.execute(_UPDATE_NODE, [dropped, seq, seq, node.organization_id, node.pk])
    return batch_id, ids


def _check_node(node: Node, records: list[Parsed]) -> None:
    """The kinds' checks of the records against the node that posts them (`TelemetryKind.check_node`)."""
    per_kind: dict[str, list[tuple[int, dict]]] = defaultdict(list)
    for i, (name, _ts, data, _text) in enumerate(records):
        if kinds.get(name).check_node is not None:
            per_kind[name].append((i, data))
    for name, indexed in per_kind.items():
        try:
            kinds.get(name).check_node(node, indexed)
        except kinds.KindInvalid as exc:
            where = f"records[{exc.index}].data" + (f".{exc.field}" if exc.field else "")
            raise BatchInvalid(where, exc.problem) from None


def _by_kind(node: Node, seq: int, batch_id: int, ids: list[int], records: list[Parsed]) -> list[kinds.StoredRecords]:
    per_kind: dict[str, list[kinds.StoredRecord]] = defaultdict(list)
    for record_id, (kind, ts, data, _text) in zip(ids, records, strict=True):
        per_kind[kind].append(kinds.StoredRecord(record_id, ts, data))
    return [
        kinds.StoredRecords(kind=kind, organization_id=node.organization_id, cluster_id=node.cluster_id,
                            node_id=node.pk, batch_id=batch_id, seq=seq, records=tuple(records))
        for kind, records in per_kind.items()
    ]
