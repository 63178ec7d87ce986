"""The console's registry of telemetry kinds: what agents may post, and what happens after.

A feature that sends telemetry registers its kind here, from its app's `ready()`, as commands
are registered in `console.commands.registry`:

    from console.telemetry import kinds

    kinds.register(kinds.TelemetryKind(
        name="probe.window",
        description="One probe window between two NICs: loss, RTT quantiles.",
        validate=kinds.shape({"src": kinds.text(255), "dst": kinds.text(255), "loss": kinds.number(0, 1)},
                             required=("src", "dst")),
    ))

    @kinds.handler("probe.window")
    def triangulate(stored: kinds.StoredRecords) -> None:
        ...  # runs after the batch is committed, in the node's organization

- `validate(data) -> data` checks one record's `data` (and may normalize it); it raises
  `KindInvalid(field, problem)` naming the field inside `data`. The agent is told
  `records[3].data.loss: must be a number in 0..1` and drops that record only.
- `check_node(node, records)` (optional) checks a batch's records of the kind against the node
  that posts them (`records`: `[(index in the batch, data)]`), before anything is stored: a probe
  window must name the node's own NICs. It raises `KindInvalid(field, problem, index=i)`.
- `max_bytes` (optional): the record's data, as the JSON it is stored as, is at most this long
  (`records[3].data: is 2000000 bytes as JSON; at most 1048576`); data that holds a number
  that is not finite is refused for every kind.
- `file(stored)` (optional) runs inside the batch's transaction, after its records are inserted,
  with the records of its kind (in the caller's scope: the node's organization): rows a feature
  keeps with the batch, stored with it or not at all, in the batch's one commit (a probe window's
  fill count). An exception from it refuses the batch. Keep it to a few statements.
- Handlers run once per stored batch, after its transaction commits (so a rolled-back batch
  triggers nothing, and a retried duplicate is not handled twice), with the records of their
  kind, in the node's organization (`console.core.scoping.for_organization`). They run on the
  agent request's database thread: keep them short, and hand slow work to a Celery task.
  A handler that raises is logged and counted (`lockstep_telemetry_handler_errors_total`);
  the batch stays stored and the other handlers still run.
- A kind nobody registered is refused (`records[i].kind: unknown telemetry kind`).

Agent-forwarded events (the local socket's `event` messages, docs/seams.md) arrive as kinds
`event.<kind>`; each kind of the contract is registered here with a bounded generic validator.
A feature may register the same name with a stricter validator (it replaces the generic one,
keeping handlers already attached) and attach handlers to it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from console.core import limits
from console.core.errors import Invalid

log = logging.getLogger(__name__)

__all__ = [
    "KindInvalid",
    "StoredRecord",
    "StoredRecords",
    "TelemetryKind",
    "UnknownKind",
    "boolean",
    "bounded",
    "get",
    "handler",
    "integer",
    "list_of",
    "names",
    "number",
    "register",
    "shape",
    "text",
]


class KindInvalid(ValueError):
    """A record's data does not fit its kind. `field` is the path inside `data` ("" for all of it)."""

    def __init__(self, field: str, problem: str, index: int | None = None):
        self.field, self.problem, self.index = field, problem, index
        super().__init__(f"{field}: {problem}" if field else problem)


class UnknownKind(Invalid):
    def __init__(self, name: str):
        super().__init__(f"unknown telemetry kind {name!r} (known: {', '.join(names())})", field="kind")


@dataclass(frozen=True)
class StoredRecord:
    id: int
    ts: datetime
    data: dict


@dataclass(frozen=True)
class StoredRecords:
    """The records of one kind in one stored batch: what a handler receives."""

    kind: str
    organization_id: int
    cluster_id: int
    node_id: int
    batch_id: int
    seq: int
    records: tuple[StoredRecord, ...]


Validator = Callable[[dict], dict]
NodeCheck = Callable[[object, list[tuple[int, dict]]], None]
Handler = Callable[[StoredRecords], None]


@dataclass
class TelemetryKind:
    name: str
    description: str
    validate: Validator
    handlers: list[Handler] = field(default_factory=list)
    check_node: NodeCheck | None = None
    file: Handler | None = None
    # The record's data as JSON at most this long, checked on the encoding it is stored with (a
    # kind whose records are big says so here rather than encoding them again in `validate`).
    max_bytes: int | None = None
    # A stand-in registered by the console for a forwarded event kind; a feature's own
    # registration of the same name replaces it.
    generic: bool = False


_kinds: dict[str, TelemetryKind] = {}


def register(kind: TelemetryKind) -> TelemetryKind:
    existing = _kinds.get(kind.name)
    if existing is not None:
        if existing is kind:
            return kind
        if not existing.generic:
            raise ValueError(f"telemetry kind {kind.name!r} is already registered")
        kind.handlers = [*existing.handlers, *(h for h in kind.handlers if h not in existing.handlers)]
    _kinds[kind.name] = kind
    return kind


def handler(name: str) -> Callable[[Handler], Handler]:
    """Decorator: run `fn(stored)` after each batch holding records of kind `name` is stored.
    The kind must be registered first (UnknownKind otherwise)."""
    get(name)

    def attach(fn: Handler) -> Handler:
        kind = get(name)  # the registration in force now (a stricter one may have replaced it)
        if fn not in kind.handlers:
            kind.handlers.append(fn)
        return fn

    return attach


def get(name: str) -> TelemetryKind:
    try:
        return _kinds[name]
    except KeyError:
        raise UnknownKind(name) from None


def names() -> list[str]:
    return sorted(_kinds)


def file_in_batch(groups: Iterable[StoredRecords]) -> None:
    """Run each group's kind's `file` (inside the batch's transaction)."""
    for group in groups:
        kind = _kinds.get(group.kind)
        if kind is not None and kind.file is not None:
            kind.file(group)


def run_handlers(groups: Iterable[StoredRecords]) -> None:
    """Run every handler of each group's kind, each in the group's organization."""
    from console.core import scoping
    from console.core.metrics import TELEMETRY_HANDLER_ERRORS

    for group in groups:
        for fn in list(_kinds[group.kind].handlers) if group.kind in _kinds else []:
            try:
                with scoping.for_organization(group.organization_id):
                    fn(group)
            except Exception:
                TELEMETRY_HANDLER_ERRORS.labels(group.kind).inc()
                log.exception("event=telemetry_handler_failed kind=%s handler=%s node=%s seq=%s", group.kind,
                              getattr(fn, "__qualname__", fn), group.node_id, group.seq)


# --- validators --------------------------------------------------------------------------------
#
# Small combinators: each takes a value and its path and returns the value (normalized) or raises
# KindInvalid naming the path. `shape` and `bounded` make a kind's `validate(data)`.

Check = Callable[[object, str], object]


def _path(parent: str, key) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def number(low: float | None = None, high: float | None = None) -> Check:
    def check(value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KindInvalid(path, f"must be a finite number, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise KindInvalid(path, f"must be in {low}..{high}, got {value!r}")
        return value
    return check


def integer(low: int | None = None, high: int | None = limits.JSON_INT_RANGE[1]) -> Check:
    def check(value, path):
        if isinstance(value, bool) or not isinstance(value, int):
            raise KindInvalid(path, f"must be an integer, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise KindInvalid(path, f"must be in {low}..{high}, got {value}")
        return value
    return check


def text(max_length: int) -> Check:
    def check(value, path):
        if not isinstance(value, str):
            raise KindInvalid(path, f"must be a string, got {value!r}")
        if len(value) > max_length:
            raise KindInvalid(path, f"is {len(value)} characters long; at most {max_length}")
        problem = limits.text_problem(value)
        if problem:
            raise KindInvalid(path, problem)
        return value
    return check


def boolean() -> Check:
    def check(value, path):
        if not isinstance(value, bool):
            raise KindInvalid(path, f"must be true or false, got {value!r}")
        return value
    return check


def list_of(item: Check, max_items: int) -> Check:
    def check(value, path):
        if not isinstance(value, list):
            raise KindInvalid(path, "must be a list")
        if len(value) > max_items:
            raise KindInvalid(path, f"has {len(value)} items; at most {max_items}")
        return [item(v, _path(path, i)) for i, v in enumerate(value)]
    return check


def nested(validate: Validator) -> Check:
    """A Check of an object with its own validator (a `shape`), its errors named under `path`."""
    def check(value, path):
        try:
            return validate(value)
        except KindInvalid as exc:
            raise KindInvalid(f"{path}.{exc.field}" if exc.field else path, exc.problem) from None
    return check


def mapping_of(item: Check, max_keys: int) -> Check:
    """An object whose values each pass `item` (keys are the caller's names: hosts, replicas)."""
    def check(value, path):
        if not isinstance(value, dict):
            raise KindInvalid(path, "must be an object")
        if len(value) > max_keys:
            raise KindInvalid(path, f"has {len(value)} keys; at most {max_keys}")
        return {k: item(v, _path(path, k)) for k, v in value.items()}
    return check


def bounded(max_bytes: int = 16 * 1024, max_depth: int = 6, max_keys: int = 64, max_items: int = 256,
            max_string: int = 4096) -> Check:
    """Any JSON object within bounds: size, nesting, keys per object, list length, string length;
    numbers finite; keys and strings free of NUL."""

    def walk(value, path, depth):
        if depth > max_depth:
            raise KindInvalid(path, f"nests deeper than {max_depth} levels")
        if isinstance(value, dict):
            if len(value) > max_keys:
                raise KindInvalid(path, f"has {len(value)} keys; at most {max_keys}")
            for key, item in value.items():
                if len(key) > 128 or limits.text_problem(key):
                    raise KindInvalid(path, f"has a key longer than 128 characters or not storable: {key[:40]!r}")
                walk(item, _path(path, key), depth + 1)
        elif isinstance(value, list):
            if len(value) > max_items:
                raise KindInvalid(path, f"has {len(value)} items; at most {max_items}")
            for i, item in enumerate(value):
                walk(item, _path(path, i), depth + 1)
        elif isinstance(value, str):
            text(max_string)(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise KindInvalid(path, f"must be a finite number, got {value!r}")
        elif isinstance(value, int) and not isinstance(value, bool) and not (
                limits.JSON_INT_RANGE[0] <= value <= limits.JSON_INT_RANGE[1]):
            raise KindInvalid(path, "is an integer beyond 64 bits")

    def check(value, path):
        if not isinstance(value, dict):
            raise KindInvalid(path, "must be an object")
        walk(value, path, 1)
        size = len(json.dumps(value, separators=(",", ":")))
        if size > max_bytes:
            raise KindInvalid(path, f"is {size} bytes as JSON; at most {max_bytes}")
        return value

    return check


def shape(fields: Mapping[str, Check], *, required: Iterable[str] = (), rest: Check | None = None,
          limits: Check | None = None) -> Validator:
    """An object with these typed fields (others allowed and kept, within `limits`)."""
    required = tuple(required)
    limits = limits or bounded()

    def validate(data: dict) -> dict:
        limits(data, "")
        for name in required:
            if name not in data:
                raise KindInvalid(name, "is required")
        out = dict(data)
        for name, check in fields.items():
            if name in data and data[name] is not None:
                out[name] = check(data[name], name)
        return out

    return validate
