"""Browser pages: thin views over the same scoped queries as the API.

Every object is looked up through the request's `Scope`, so another organization's cluster,
token or status answers 404 exactly like one that does not exist. Writes need the operator role
in the object's organization; a forged POST without it answers 403 and changes nothing.
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.fleet.events import cluster_changed
from console.fleet.install_command import install_command
from console.fleet.models import Cluster, EnrollmentToken, Node
from console.live.groups import cluster_group, organization_group
from console.tenancy.models import Role
from console.tenancy.scope import SESSION_ORGANIZATION_KEY, Scope
from console.web.maps import cluster_map, map_status
from console.web.svg import render_map

TOKENS_SHOWN = 20


def _cluster_or_404(request, pk: int) -> Cluster:
    cluster = Scope.for_request(request).filter(Cluster.objects.all()).filter(pk=pk).first()
    if cluster is None:
        raise Http404("No such cluster.")
    return cluster


def _require_operator(request, organization_id: int) -> None:
    if not Scope.for_request(request).can(organization_id, Role.OPERATOR):
        raise PermissionDenied("Your role in this organization does not allow this change.")


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


@login_required
def home(request):
    return redirect("clusters")


@login_required
@require_POST
def switch_organization(request):
    scope = Scope.for_request(request)
    try:
        org_id = int(request.POST.get("organization", ""))
    except ValueError:
        org_id = None
    if org_id is None or scope.role_in(org_id) is None:
        raise Http404("No such organization.")
    request.session[SESSION_ORGANIZATION_KEY] = org_id
    return redirect("clusters")


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def clusters(request):
    scope = Scope.for_request(request)
    org_id = scope.default_organization_id
    if request.method == "POST":
        if org_id is None:
            raise Http404("No active organization.")
        _require_operator(request, org_id)
        return _create_cluster(request, org_id)
    rows = list(Cluster.objects.filter(organization_id=org_id)) if org_id else []
    counts: dict[int, dict[str, int]] = {}
    for row in Node.objects.filter(cluster__in=rows).values("cluster_id", "state").annotate(n=Count("id")):
        per_cluster = counts.setdefault(row["cluster_id"], {"total": 0})
        per_cluster[row["state"]] = row["n"]
        per_cluster["total"] += row["n"]
    # The organization's group hears of clusters created, changed or deleted, and of node counts moving.
    live_groups = [organization_group(org_id)] if org_id else []
    return render(request, "web/clusters.html", {
        "clusters": [(c, counts.get(c.pk, {})) for c in rows],
        "can_write": scope.can(org_id, Role.OPERATOR),
        "live_groups": live_groups,
    })


def _create_cluster(request, org_id: int):
    name = request.POST.get("name", "").strip()
    if not name or len(name) > 100:
        messages.error(request, "A cluster needs a name of 1 to 100 characters.")
        return redirect("clusters")
    try:
        with transaction.atomic():
            cluster = Cluster.objects.create(organization_id=org_id, name=name)
            cluster_changed(org_id, cluster.pk)
    except IntegrityError:
        messages.error(request, f"A cluster named {name!r} already exists.")
        return redirect("clusters")
    messages.success(request, f"Cluster {name!r} created.")
    return redirect("cluster", pk=cluster.pk)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def cluster(request, pk: int):
    cluster = _cluster_or_404(request, pk)
    created_token = None
    if request.method == "POST":
        _require_operator(request, cluster.organization_id)
        created_token = _create_enrollment_token(request, cluster)
    drawing = cluster_map(cluster)
    status = map_status(cluster, drawing)
    health = {kind: {row["name"]: row["health"] for row in status.get(key, ())} for kind, key in
              (("node", "nodes"), ("switch", "switches"), ("nic", "nics"), ("link", "links"), ("bundle", "bundles"))}
    response = render(request, "web/cluster.html", {
        "cluster": cluster,
        "nodes": Node.objects.filter(cluster=cluster).only("id", "name", "state", "last_seen", "agent_version")
        .annotate(gpu_count=Count("gpus")).order_by("position", "name"),
        "drawing": drawing,
        "can_write": Scope.for_request(request).can(cluster.organization_id, Role.OPERATOR),
        "created_token": created_token,
        "tokens": EnrollmentToken.objects.filter(cluster=cluster).order_by("-created")[:TOKENS_SHOWN],
        "live_groups": [cluster_group(cluster.organization_id, cluster.pk)],
        "status": status,
        "map_svg": render_map(drawing, health, f"Fabric topology of {cluster.name}") if drawing else None,
    }, status=201 if created_token else 200)
    if created_token:
        response["Cache-Control"] = "no-store"  # the token is shown once; keep it out of caches
    return response


def _create_enrollment_token(request, cluster: Cluster) -> dict | None:
    try:
        hours = int(request.POST.get("expires_hours", "24"))
        max_uses = request.POST.get("max_uses", "").strip()
        max_uses = int(max_uses) if max_uses else None
    except ValueError:
        messages.error(request, "Expiry and maximum uses must be whole numbers.")
        return None
    if not 1 <= hours <= 24 * 365 or (max_uses is not None and max_uses < 1):
        messages.error(request, "Expiry must be 1 hour to 1 year, and maximum uses at least 1.")
        return None
    token = EnrollmentToken(
        organization_id=cluster.organization_id, cluster=cluster, created_by=request.user,
        description=request.POST.get("description", "").strip()[:200],
        expires=timezone.now() + timedelta(hours=hours), max_uses=max_uses,
    )
    plaintext = token.set_new_secret()
    token.save()
    return {"token": plaintext, "install_command": install_command(request, plaintext), "expires": token.expires,
            "prefix": token.prefix_display}


@login_required
@require_POST
def revoke_enrollment_token(request, pk: int, token_pk: int):
    cluster = _cluster_or_404(request, pk)
    token = EnrollmentToken.objects.filter(cluster=cluster, pk=token_pk).first()
    if token is None:
        raise Http404("No such enrollment token.")
    _require_operator(request, cluster.organization_id)
    if token.is_revoked:
        messages.info(request, f"Token {token.prefix_display} was already revoked.")
    else:
        token.revoke()
        messages.success(request, f"Token {token.prefix_display} revoked: agents can no longer enroll with it.")
    return redirect("cluster", pk=cluster.pk)


@login_required
@require_GET
def cluster_status_json(request, pk: int):
    cluster = _cluster_or_404(request, pk)
    return JsonResponse(map_status(cluster, cluster_map(cluster)))
