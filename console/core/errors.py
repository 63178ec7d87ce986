"""Domain errors: what the services refuse, and why, in words — never an HTTP status.

Services (`console/*/services.py`) raise these; the callers decide what they become. The REST
API and the agent endpoints turn them into one JSON shape with one translation
(`api.errors.translate`): `{"error": code, "detail": sentence, "fields": {field: problem}}`,
documented in docs/api.md. Browser pages show `detail` as a message; management commands print
it. The class says what kind of refusal it is, `code` names it for programs (the agent acts on
`enrollment_token_expired`, `node_retired`, `busy`), `fields` names the culprits.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "Busy",
    "Conflict",
    "DomainError",
    "Forbidden",
    "Invalid",
    "NotFound",
    "TooLarge",
    "Unauthenticated",
    "flatten",
]


class DomainError(Exception):
    code = "error"

    def __init__(self, detail: str, *, field: str | None = None, problem: str | None = None,
                 fields: Mapping[str, str] | None = None, code: str | None = None):
        super().__init__(detail)
        self.detail = detail
        self.code = code or type(self).code
        self.fields: dict[str, str] = dict(fields or {})
        if field is not None:
            self.fields.setdefault(field, problem or detail)

    @property
    def field(self) -> str | None:
        """The first field to blame, if any."""
        return next(iter(self.fields), None)


class Invalid(DomainError):
    """The input is wrong: a value, a shape, a reference to something that does not exist here."""

    code = "invalid"


class Unauthenticated(DomainError):
    """A credential (enrollment token, node credential) that does not hold."""

    code = "not_authenticated"


class Forbidden(DomainError):
    """Known caller, not allowed: a role too low, a token of another cluster, a retired node."""

    code = "permission_denied"


class NotFound(DomainError):
    """No such object for this caller (another tenant's objects are not found either)."""

    code = "not_found"


class Conflict(DomainError):
    """Valid, but the current state forbids it: a name taken, a node already draining."""

    code = "conflict"


class TooLarge(DomainError):
    """More than the bound: a body, a batch, a document."""

    code = "too_large"


class Busy(DomainError):
    """Not now: the console is saturated; try again after `retry_after_s`."""

    code = "busy"

    def __init__(self, detail: str, *, retry_after_s: int, **kwargs):
        super().__init__(detail, **kwargs)
        self.retry_after_s = retry_after_s


def flatten(detail, prefix: str = "") -> dict[str, str]:
    """DRF's nested error detail as {dotted.field[0]: problem}."""
    if isinstance(detail, dict):
        out: dict[str, str] = {}
        for key, value in detail.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return {prefix or "non_field_errors": " ".join(str(item) for item in detail)}
        out = {}
        for i, item in enumerate(detail):
            if item:
                out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix or "non_field_errors": str(detail)}
