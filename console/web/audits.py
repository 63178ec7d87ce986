"""Audit pages: a cluster's audits (start one), an audit's report (live), its PDF; thin views over
console.audits, in the signed-in user's tenant scope (console.web.views.tenant_view)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.audits import report, services
from console.audits.models import AuditRun
from console.core.errors import DomainError
from console.live.groups import cluster_group
from console.tenancy.models import Role
from console.tenancy.scope import Scope
from console.web.views import _cluster_or_404, _require_operator, tenant_view

RUNS_SHOWN = 50


def _run_or_404(pk: int) -> AuditRun:
    run = AuditRun.objects.select_related("cluster").filter(pk=pk).first()
    if run is None:
        raise Http404("No such audit.")
    return run


@tenant_view
@require_http_methods(["GET", "HEAD", "POST"])
def audits(request, pk: int):
    cluster = _cluster_or_404(request, pk)
    if request.method == "POST":
        _require_operator(request, cluster.organization_id)
        try:
            run, _ = services.start_audit(cluster, options={"load": request.POST.get("load") == "1"},
                                          user=request.user)
        except DomainError as exc:
            messages.error(request, exc.detail)
            return redirect("audits", pk=cluster.pk)
        return redirect("audit", audit_pk=run.pk)
    runs = AuditRun.objects.filter(cluster=cluster).order_by("-created")[:RUNS_SHOWN]
    return render(request, "audits/runs.html", {
        "cluster": cluster,
        "runs": [(r, [f"{c['kind']} {c['name']}" for c in (r.report or {}).get("culprits", [])]) for r in runs],
        "can_write": Scope.for_request(request).can(cluster.organization_id, Role.OPERATOR),
        "live_groups": [cluster_group(cluster.organization_id, cluster.pk)],
    })


@tenant_view
@require_GET
def audit(request, audit_pk: int):
    run = _run_or_404(audit_pk)
    return render(request, "audits/run.html", report.context(run) | {
        "can_write": Scope.for_request(request).can(run.organization_id, Role.OPERATOR),
        "live_groups": [cluster_group(run.organization_id, run.cluster_id)],
    })


@tenant_view
@require_POST
def cancel_audit(request, audit_pk: int):
    run = _run_or_404(audit_pk)
    _require_operator(request, run.organization_id)
    try:
        services.cancel(run)
        messages.success(request, f"Audit {run.pk} cancelled.")
    except DomainError as exc:
        messages.error(request, exc.detail)
    return redirect("audit", audit_pk=run.pk)


@tenant_view
@require_GET
def audit_pdf(request, audit_pk: int):
    run = _run_or_404(audit_pk)
    response = HttpResponse(report.pdf(run), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="audit-{run.pk}.pdf"'
    return response
