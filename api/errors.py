"""One error shape for the whole API, and the one translation into it.

Every error answer of `/api/v1/` (the REST API and the agent endpoints) and of `/metrics` is

    {"error": "<code>", "detail": "<a sentence>", "fields": {"<field>": "<what is wrong>"}}

with `fields` present when particular fields are to blame (`records[3].ts`, `host.hostname`,
`links[12].b`). Domain errors (`console.core.errors`) carry no HTTP status: `translate()` is
the only place that maps them to one. DRF's own exceptions (validation, authentication, 404
from a scoped lookup) take the same shape in `exception_handler`. See docs/api.md.
"""

from __future__ import annotations

from django.http import JsonResponse
from rest_framework import exceptions, status
from rest_framework.views import exception_handler as drf_exception_handler

from console.core import errors
from console.core.errors import flatten

STATUS: dict[type[errors.DomainError], int] = {
    errors.Invalid: status.HTTP_400_BAD_REQUEST,
    errors.Unauthenticated: status.HTTP_401_UNAUTHORIZED,
    errors.Forbidden: status.HTTP_403_FORBIDDEN,
    errors.NotFound: status.HTTP_404_NOT_FOUND,
    errors.Conflict: status.HTTP_409_CONFLICT,
    errors.TooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    errors.Busy: status.HTTP_503_SERVICE_UNAVAILABLE,
}

# Codes of DRF's own exceptions, by status.
CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "permission_denied",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_406_NOT_ACCEPTABLE: "not_acceptable",
    status.HTTP_409_CONFLICT: "conflict",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "too_large",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


def body(code: str, detail: str, fields: dict[str, str] | None = None) -> dict:
    """The error shape."""
    out = {"error": code, "detail": detail}
    if fields:
        out["fields"] = fields
    return out


def translate(exc: errors.DomainError) -> tuple[int, dict, dict[str, str]]:
    """(status, body, headers) of a domain error."""
    status_code = next((code for kind, code in STATUS.items() if isinstance(exc, kind)), status.HTTP_400_BAD_REQUEST)
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, errors.Busy) else {}
    return status_code, body(exc.code, exc.detail, exc.fields), headers


def error_response(exc: errors.DomainError) -> JsonResponse:
    """A domain error as a plain Django answer (agent endpoints, /metrics)."""
    status_code, payload, headers = translate(exc)
    return JsonResponse(payload, status=status_code, headers=headers)


def _sentence(fields: dict[str, str]) -> str:
    return "; ".join(f"{k}: {v}" if k != "non_field_errors" else v for k, v in fields.items())


def exception_handler(exc, context):
    if isinstance(exc, errors.DomainError):
        from rest_framework.response import Response

        status_code, payload, headers = translate(exc)
        return Response(payload, status=status_code, headers=headers)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = CODES.get(response.status_code, "error")
    if isinstance(exc, exceptions.ValidationError) or isinstance(exc, exceptions.APIException) and isinstance(exc.detail, (list, dict)):
        fields = flatten(exc.detail)
        response.data = body(code, _sentence(fields), fields)
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        response.data = body(code, str(detail))
    return response


# --- the error answers in the OpenAPI schema -------------------------------------------------------

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error answer of the API (docs/api.md).",
    "properties": {
        "error": {"type": "string", "description": "What kind of refusal: invalid, not_found, conflict, ..."},
        "detail": {"type": "string", "description": "A sentence for people."},
        "fields": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "The fields to blame (`links[12].b`) and what is wrong with each."},
    },
    "required": ["error", "detail"],
}
_ERRORS_EVERYWHERE = {
    "400": "A query parameter or the body is invalid; `fields` names each.",
    "401": "No credential, or one that does not hold (expired, revoked, unknown).",
    "403": "The caller's role or token scope does not allow this.",
    "406": "The Accept header asks for a format this route does not produce.",
}
_ERRORS_OF_OBJECTS = {"404": "No such object for this caller (another organization's objects are not found either)."}
_ERRORS_OF_WRITES = {
    "404": _ERRORS_OF_OBJECTS["404"],
    "409": "Valid, but the current state forbids it (a name taken, the last owner).",
    "413": "The body is larger than this route accepts.",
    "415": "The body is not in a format this route reads (JSON).",
}


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: every operation documents the error answers it can
    give, all in the one error shape, so clients (and the generated API test) know them."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    content = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            errors_here = dict(_ERRORS_EVERYWHERE)
            if "{" in path:
                errors_here.update(_ERRORS_OF_OBJECTS)
            if method in ("post", "put", "patch", "delete"):
                errors_here.update(_ERRORS_OF_WRITES)
            responses = operation.setdefault("responses", {})
            for code, description in errors_here.items():
                responses.setdefault(code, {"description": description, "content": content})
    return result


def not_found(request, exception=None):
    """The 404 of a URL that names no route: the error shape under /api/, the plain page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(body("not_found", f"No route {request.path!r} in the API."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
