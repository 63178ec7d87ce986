"""Validate and store a telemetry batch from an agent: all of it, once, or nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils.dateparse import parse_datetime

from console.fleet.models import Node
from console.telemetry.models import TelemetryBatch, TelemetryRecord

KIND = re.compile(r"^[a-z0-9_.]{1,64}$")
# Timestamps outside this range are agent clock bugs, not measurements.
TS_MIN, TS_MAX = datetime(2000, 1, 1, tzinfo=dt_timezone.utc), datetime(2100, 1, 1, tzinfo=dt_timezone.utc)


class BatchInvalid(ValueError):
    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


class BatchTooLarge(ValueError):
    pass


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
        ts = parse_datetime(value)
        if ts is None or ts.tzinfo is None:
            raise BatchInvalid(field, f"{value!r} is not ISO 8601 with a time zone")
    else:
        raise BatchInvalid(field, "must be an ISO 8601 string or Unix seconds")
    if not TS_MIN <= ts < TS_MAX:
        raise BatchInvalid(field, f"{value!r} is outside 2000..2100")
    return ts


def parse_batch(payload, max_records: int) -> tuple[int, int, list[tuple[str, datetime, dict]]]:
    """(seq, dropped, [(kind, ts, data)]) or BatchInvalid naming the first bad field."""
    if not isinstance(payload, dict):
        raise BatchInvalid("batch", "must be a JSON object")
    seq = payload.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise BatchInvalid("seq", f"must be an integer ≥ 1, got {seq!r}")
    dropped = payload.get("dropped", 0)
    if not isinstance(dropped, int) or isinstance(dropped, bool) or dropped < 0:
        raise BatchInvalid("dropped", f"must be an integer ≥ 0, got {dropped!r}")
    records = payload.get("records")
    if not isinstance(records, list):
        raise BatchInvalid("records", "must be a list")
    if len(records) > max_records:
        raise BatchTooLarge(f"{len(records)} records in one batch; the limit is {max_records}")
    parsed = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise BatchInvalid(f"records[{i}]", "must be an object")
        kind = record.get("kind")
        if not isinstance(kind, str) or not KIND.match(kind):
            raise BatchInvalid(f"records[{i}].kind", f"{kind!r} is not a dotted name ([a-z0-9_.], ≤ 64)")
        data = record.get("data", {})
        if not isinstance(data, dict):
            raise BatchInvalid(f"records[{i}].data", "must be an object")
        parsed.append((kind, _timestamp(record.get("ts"), f"records[{i}].ts"), data))
    return seq, dropped, parsed


def ingest(node: Node, payload, max_records: int) -> IngestResult:
    seq, dropped, records = parse_batch(payload, max_records)
    if TelemetryBatch.objects.filter(node=node, seq=seq).exists():
        return IngestResult(0, True)
    try:
        with transaction.atomic():
            batch = TelemetryBatch.objects.create(
                organization_id=node.organization_id, cluster_id=node.cluster_id, node=node,
                seq=seq, record_count=len(records), dropped=dropped,
            )
            TelemetryRecord.objects.bulk_create(
                [
                    TelemetryRecord(organization_id=node.organization_id, cluster_id=node.cluster_id,
                                    node=node, batch=batch, kind=kind, ts=ts, data=data)
                    for kind, ts, data in records
                ],
                batch_size=1000,
            )
            Node.objects.filter(pk=node.pk).update(
                telemetry_dropped=F("telemetry_dropped") + dropped,
                telemetry_seq=Greatest(F("telemetry_seq"), seq),
            )
    except IntegrityError:
        # The same batch, retried concurrently, was stored first.
        if TelemetryBatch.objects.filter(node=node, seq=seq).exists():
            return IngestResult(0, True)
        raise
    return IngestResult(len(records), False)
