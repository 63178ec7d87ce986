"""One error shape for the whole API: `{"error": code, "detail": sentence, "fields": {...}}`."""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.views import exception_handler as drf_exception_handler

CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "permission_denied",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_409_CONFLICT: "conflict",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "too_large",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "too_large"


def _flatten(detail, prefix: str = "") -> dict[str, str]:
    if isinstance(detail, dict):
        out: dict[str, str] = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return {prefix or "non_field_errors": " ".join(str(item) for item in detail)}
        out = {}
        for i, item in enumerate(detail):
            if item:
                out.update(_flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix or "non_field_errors": str(detail)}


def exception_handler(exc, context):
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = CODES.get(response.status_code, "error")
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        detail = "; ".join(f"{k}: {v}" if k != "non_field_errors" else v for k, v in fields.items())
        body = {"error": code, "detail": detail, "fields": fields}
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        if isinstance(detail, (list, dict)):
            body = {"error": code, "detail": "; ".join(_flatten(detail).values()), "fields": _flatten(detail)}
        else:
            body = {"error": getattr(detail, "code", None) if code == "error" else code, "detail": str(detail)}
            body["error"] = body["error"] or code
    response.data = body
    return response
