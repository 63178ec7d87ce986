"""``GET /install.sh`` and ``GET /agent/<package>`` (and ``.sha256``): public, no secrets.

Nothing here uses the network: the package is built from ``agent/`` and the wheels fetched
at set-up time (see :mod:`console.agentdist.build`), and cached until its inputs change.
"""

from __future__ import annotations

import logging

from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseNotFound
from django.views.decorators.http import require_safe

from console.agentdist.build import PackageUnavailable, current_packages
from console.agentdist.installer import failing_script, render_install_script
from console.fleet.install_command import console_url

log = logging.getLogger(__name__)

# What anonymous callers are told; why (file names, paths on the server) goes to the log only.
UNAVAILABLE = ("the console cannot serve the agent package (not built). An administrator runs "
               "`make agent-package` (or `manage.py build_agent_package --download`) on the console; "
               "the console's log says what is missing")


def _unavailable_reason(exc: PackageUnavailable) -> str:
    log.error("agent package unavailable: %s", exc)
    return UNAVAILABLE


def _unavailable(exc: PackageUnavailable) -> HttpResponse:
    return HttpResponse(f"lockstep: {_unavailable_reason(exc)}\n", status=503,
                        content_type="text/plain; charset=utf-8")


@require_safe
def install_script(request):
    try:
        package, *variants = current_packages()
    except PackageUnavailable as exc:
        # 200 on purpose: `curl -fsSL .../install.sh | sudo sh` then shows the operator why,
        # with the installer's exit code for "the console cannot serve the package".
        body = failing_script(_unavailable_reason(exc))
        response = HttpResponse(body, content_type="text/x-shellscript; charset=utf-8")
        response["X-Lockstep-Error"] = "agent-package-unavailable"
    else:
        try:
            body = render_install_script(console_url(request), package, variants=variants)
        except ValueError as exc:
            return HttpResponseBadRequest(f"{exc}\n", content_type="text/plain; charset=utf-8")
        response = HttpResponse(body, content_type="text/x-shellscript; charset=utf-8")
        response["X-Lockstep-Agent-Version"] = package.version
    response["Cache-Control"] = "no-store"
    response["Content-Disposition"] = 'inline; filename="install.sh"'
    return response


@require_safe
def agent_package(request, filename: str):
    try:
        packages = current_packages()
    except PackageUnavailable as exc:
        return _unavailable(exc)
    package = next((p for p in packages if filename in (p.filename, f"{p.filename}.sha256")), packages[0])
    if filename == package.filename:
        response = HttpResponse(package.path.read_bytes(), content_type="application/gzip")
        response["Content-Disposition"] = f'attachment; filename="{package.filename}"'
    elif filename == f"{package.filename}.sha256":
        response = HttpResponse(package.sha256_line, content_type="text/plain; charset=utf-8")
    else:
        return HttpResponseNotFound(f"No agent package {filename!r}: this console serves {package.filename}.\n",
                                    content_type="text/plain; charset=utf-8")
    response["ETag"] = f'"{package.sha256}"'
    response["Cache-Control"] = "no-cache"
    return response
