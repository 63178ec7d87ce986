"""Browser pages: thin views over the services, in the signed-in user's tenant scope.

`tenant_view` enters the user's organizations as the tenant scope for the whole view, page
rendering included, so another organization's cluster, token or status answers 404 exactly like
one that does not exist. Writes need the operator role in the object's organization; a forged
POST without it answers 403 and changes nothing. Domain errors become messages on the page.
"""

from __future__ import annotations

import functools
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.clocks.models import ClockSync, NodeClock
from console.core.errors import DomainError
from console.fleet import services
from console.fleet.install_command import TOKEN_FILE, install_command, install_command_token_file
from console.fleet.models import Cluster, EnrollmentToken, Node
from console.incidents.models import Incident
from console.live.groups import cluster_group, organization_group
from console.tenancy import services as tenancy
from console.tenancy.models import Role
from console.tenancy.scope import SESSION_ORGANIZATION_KEY, Scope
from console.web.heatmap import heatmap_svg, timeline_svg
from console.web.maps import cluster_map, map_status
from console.web.svg import render_map

TOKENS_SHOWN = 20


def tenant_view(view):
    """A page for signed-in users, run in their tenant scope (see the module docstring)."""

    @login_required
    @functools.wraps(view)
    def scoped(request, *args, **kwargs):
        with Scope.for_request(request).active():
            response = view(request, *args, **kwargs)
            if hasattr(response, "render") and not getattr(response, "is_rendered", True):
                response.render()
            return response

    return scoped


def _cluster_or_404(request, pk: int) -> Cluster:
    cluster = Cluster.objects.filter(pk=pk).first()
    if cluster is None:
        raise Http404("No such cluster.")
    return cluster


def _require_operator(request, organization_id: int) -> None:
    if not Scope.for_request(request).can(organization_id, Role.OPERATOR):
        raise PermissionDenied("Your role in this organization does not allow this change.")


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")


@tenant_view
def home(request):
    return redirect("clusters")


@tenant_view
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


@tenant_view
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
    counts = services.node_counts_by_state([c.pk for c in rows])
    # The organization's group hears of clusters created, changed or deleted, and of node counts moving.
    live_groups = [organization_group(org_id)] if org_id else []
    return render(request, "web/clusters.html", {
        "clusters": [(c, counts[c.pk]) for c in rows],
        "can_write": scope.can(org_id, Role.OPERATOR),
        "live_groups": live_groups,
    })


def _create_cluster(request, org_id: int):
    try:
        cluster = services.create_cluster(org_id, request.POST.get("name", ""))
    except DomainError as exc:
        messages.error(request, exc.detail)
        return redirect("clusters")
    messages.success(request, f"Cluster {cluster.name!r} created.")
    return redirect("cluster", pk=cluster.pk)


@tenant_view
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
        "token_ttl_hours": int(services.ENROLLMENT_TOKEN_TTL.total_seconds() // 3600),
        "token_max_ttl_hours": int(services.ENROLLMENT_TOKEN_MAX_TTL.total_seconds() // 3600),
        "token_max_uses": services.ENROLLMENT_TOKEN_MAX_USES,
        "tokens": EnrollmentToken.objects.filter(cluster=cluster).order_by("-created")[:TOKENS_SHOWN],
        "live_groups": [cluster_group(cluster.organization_id, cluster.pk)],
        "status": status,
        "map_svg": render_map(drawing, health, f"Fabric topology of {cluster.name}") if drawing else None,
        "clock_sync": ClockSync.objects.filter(cluster=cluster).select_related("reference").first(),
        "node_clocks": NodeClock.objects.filter(cluster=cluster).select_related("node").order_by("node__name"),
    }, status=201 if created_token else 200)
    if created_token:
        response["Cache-Control"] = "no-store"  # the token is shown once; keep it out of caches
    return response


def _create_enrollment_token(request, cluster: Cluster) -> dict | None:
    try:
        hours = request.POST.get("expires_hours", "").strip()
        lifetime = timedelta(hours=int(hours)) if hours else None
        max_uses = request.POST.get("max_uses", "").strip()
        max_uses = int(max_uses) if max_uses else services.ENROLLMENT_TOKEN_MAX_USES
    except (ValueError, OverflowError):
        messages.error(request, "Expiry and maximum uses must be whole numbers.")
        return None
    try:
        minted = services.mint_enrollment_token(
            cluster, created_by=request.user, description=request.POST.get("description", "").strip(),
            lifetime=lifetime, max_uses=max_uses,
        )
    except DomainError as exc:
        messages.error(request, exc.detail)
        return None
    return {"token": minted.plaintext, "install_command": install_command(request),
            "install_command_token_file": install_command_token_file(request), "token_file": TOKEN_FILE,
            "expires": minted.token.expires, "prefix": minted.token.prefix_display}


@tenant_view
@require_POST
def revoke_enrollment_token(request, pk: int, token_pk: int):
    cluster = _cluster_or_404(request, pk)
    token = EnrollmentToken.objects.filter(cluster=cluster, pk=token_pk).first()
    if token is None:
        raise Http404("No such enrollment token.")
    _require_operator(request, cluster.organization_id)
    if not services.revoke_enrollment_token(token):
        messages.info(request, f"Token {token.prefix_display} was already revoked.")
    else:
        messages.success(request, f"Token {token.prefix_display} revoked: agents can no longer enroll with it.")
    return redirect("cluster", pk=cluster.pk)


@tenant_view
@require_GET
def cluster_status_json(request, pk: int):
    cluster = _cluster_or_404(request, pk)
    return JsonResponse(map_status(cluster, cluster_map(cluster)))


@tenant_view
@require_http_methods(["GET", "HEAD", "POST"])
def invitations(request):
    """The invitations addressed to the signed-in user; accepting one makes them a member."""
    if request.method == "POST":
        invitation_id, action = request.POST.get("invitation", ""), request.POST.get("action", "")
        if action not in ("accept", "decline"):
            messages.error(request, "Choose accept or decline.")
            return redirect("invitations")
        try:
            if action == "accept":
                membership = tenancy.accept_invitation(request.user, invitation_id)
                request.session[SESSION_ORGANIZATION_KEY] = membership.organization_id
                messages.success(request, f"You joined as {membership.role}.")
                return redirect("clusters")
            tenancy.decline_invitation(request.user, invitation_id)
        except DomainError as exc:
            raise Http404(exc.detail) from None
        messages.info(request, "Invitation declined.")
        return redirect("invitations")
    return render(request, "web/invitations.html", {"invitations": tenancy.invitations_for(request.user)})


@tenant_view
@require_GET
def incident(request, pk: int, incident_pk: int):
    cluster = _cluster_or_404(request, pk)
    found = Incident.objects.filter(cluster=cluster, pk=incident_pk).first()
    if found is None:
        raise Http404("No such incident.")
    events = list(found.events.order_by("ts", "id"))
    points = [e for e in events if e.kind == "window" and e.loss is not None]
    name = f"{found.kind} {found.culprit}"
    return render(request, "web/incident.html", {
        "cluster": cluster,
        "incident": found,
        "events": [e for e in events if e.kind != "window"],
        "windows_shown": len(points),
        "heatmap": heatmap_svg(found.evidence.get("during", []), f"Loss of the pairs crossing {name}"),
        "timeline": timeline_svg([((e.ts - points[0].ts).total_seconds(), e.loss) for e in points],
                                 f"Loss of {name} per window") if points else "",
        "live_groups": [cluster_group(cluster.organization_id, cluster.pk)],
    })
