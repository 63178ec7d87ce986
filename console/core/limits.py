"""What input must be before it is stored: the one place that says so.

The database schema is the source of the limits: a value bound for a column is checked against
that column (its `max_length`, the integer range of its type), so a limit changed in a model
is the limit enforced, and nothing is cut or overflows at the database (a 500). Text anywhere
(columns and JSON documents alike) must be storable: no NUL character (PostgreSQL refuses it)
and no lone surrogate (not UTF-8). JSON bodies are parsed strictly: no NaN or Infinity, nested
at most MAX_JSON_DEPTH deep. Every refusal is `Invalid` naming the field (`records[3].ts`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

from console.core.errors import Invalid

MAX_JSON_DEPTH = 64
# Integers inside JSON documents (stored as jsonb/JSON text) stay within a signed 64-bit range,
# what every client and the database's numeric handling agree on.
JSON_INT_RANGE = (-(2**63), 2**63 - 1)


def text_problem(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character"
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        return "contains an unpaired surrogate (not UTF-8 text)"
    return None


def column_problem(model: type[models.Model], field_name: str, value) -> str | None:
    """Why `value` cannot be stored in `model.field_name`, or None when it can."""
    field = model._meta.get_field(field_name)
    if value is None:
        return None if field.null else "is required"
    if isinstance(field, (models.CharField, models.TextField)):
        if not isinstance(value, str):
            return f"{value!r} is not a string"
        problem = text_problem(value)
        if problem:
            return problem
        if field.max_length is not None and len(value) > field.max_length:
            return f"is {len(value)} characters long; the most is {field.max_length}"
    elif isinstance(field, models.IntegerField):
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{value!r} is not an integer"
        low, high = BaseDatabaseOperations.integer_field_ranges[field.get_internal_type()]
        if not low <= value <= high:
            return f"{value} is out of range ({low} to {high})"
    return None


def check_columns(checks: Iterable[tuple[str, type[models.Model], str, object]]) -> None:
    """Raise Invalid naming every (where, model, field, value) whose value does not fit its column."""
    problems = {}
    for where, model, field_name, value in checks:
        problem = column_problem(model, field_name, value)
        if problem and where not in problems:
            problems[where] = problem
    if problems:
        first = next(iter(problems.items()))
        raise Invalid(f"{first[0]}: {first[1]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                      fields=problems)


def json_problem(document, where: str = "") -> tuple[str, str] | None:
    """(path, problem) of the first value of a parsed JSON document that cannot be stored."""
    stack = [(document, where, 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return path or "(body)", f"nested more than {MAX_JSON_DEPTH} deep"
        if isinstance(value, str):
            problem = text_problem(value)
            if problem:
                return path or "(body)", problem
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not JSON_INT_RANGE[0] <= value <= JSON_INT_RANGE[1]:
                return path or "(body)", f"{value} is an integer beyond 64 bits"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return path or "(body)", "is not a finite number"
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else str(key)
                problem = text_problem(key) if isinstance(key, str) else None
                if problem:
                    return path or "(body)", f"a key {problem}"
                stack.append((item, child, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
    return None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def loads(raw: bytes | str):
    """A JSON body, parsed strictly (see the module docstring); Invalid naming what is wrong."""
    try:
        document = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise Invalid(f"The body is nested more than {MAX_JSON_DEPTH} deep.", field="(body)") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, NaN, a 5,000-digit integer
        raise Invalid(f"The body is not JSON: {exc}") from None
    found = json_problem(document)
    if found:
        raise Invalid(f"{found[0]}: {found[1]}", field=found[0], problem=found[1])
    return document


def check_json(document, where: str) -> None:
    """Invalid when a JSON value that arrived some other way (a form, a Python caller) cannot be stored."""
    found = json_problem(document, where)
    if found:
        raise Invalid(f"{found[0]}: {found[1]}", field=found[0], problem=found[1])
