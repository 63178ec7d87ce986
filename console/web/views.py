"""Browser pages: thin views over the same scoped queries as the API."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.fleet.install_command import install_command
from console.fleet.models import Cluster, EnrollmentToken, Node
from console.fleet.status import cluster_status
from console.fleet.topology_io import export_topology
from console.live.groups import cluster_group, organization_group
from console.tenancy.models import Role
from console.tenancy.scope import SESSION_ORGANIZATION_KEY, Scope
from workers.fabric.layout import layout
from workers.fabric.topology import parse_topology

# Above this many cables the map shows switches and hosts without per-NIC cables.
MAP_MAX_LINKS = 6000


def _cluster_or_404(request, pk: int) -> Cluster:
    cluster = Scope.for_request(request).filter(Cluster.objects.all()).filter(pk=pk).first()
    if cluster is None:
        raise Http404("No such cluster.")
    return cluster


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
def clusters(request):
    scope = Scope.for_request(request)
    org_id = scope.default_organization_id
    if request.method == "POST":
        if not scope.can(org_id, Role.OPERATOR):
            messages.error(request, "Your role does not allow creating clusters.")
            return redirect("clusters")
        name = request.POST.get("name", "").strip()
        if not name or len(name) > 100:
            messages.error(request, "A cluster needs a name of 1 to 100 characters.")
        elif Cluster.objects.filter(organization_id=org_id, name=name).exists():
            messages.error(request, f"A cluster named {name!r} already exists.")
        else:
            cluster = Cluster.objects.create(organization_id=org_id, name=name)
            return redirect("cluster", pk=cluster.pk)
        return redirect("clusters")
    rows = Cluster.objects.filter(organization_id=org_id) if org_id else Cluster.objects.none()
    counts = {}
    for node in Node.objects.filter(cluster__in=rows).values("cluster_id", "state"):
        counts.setdefault(node["cluster_id"], {}).setdefault(node["state"], 0)
        counts[node["cluster_id"]][node["state"]] += 1
    return render(request, "web/clusters.html", {
        "clusters": [(c, counts.get(c.pk, {})) for c in rows],
        "can_write": scope.can(org_id, Role.OPERATOR),
        "live_groups": [organization_group(org_id)] if org_id else [],
    })


@login_required
def cluster(request, pk: int):
    cluster = _cluster_or_404(request, pk)
    scope = Scope.for_request(request)
    can_write = scope.can(cluster.organization_id, Role.OPERATOR)
    created_token = None
    if request.method == "POST":
        if not can_write:
            messages.error(request, "Your role does not allow creating enrollment tokens.")
            return redirect("cluster", pk=pk)
        created_token = _create_enrollment_token(request, cluster)
    topology = parse_topology(export_topology(cluster)) if cluster.topology_imported_at else None
    drawing = None
    if topology is not None and topology.links:
        if len(topology.links) > MAP_MAX_LINKS:
            topology = _without_access_links(topology)
        drawing = layout(topology)
    return render(request, "web/cluster.html", {
        "cluster": cluster,
        "nodes": Node.objects.filter(cluster=cluster).order_by("position", "name"),
        "drawing": drawing,
        "can_write": can_write,
        "created_token": created_token,
        "tokens": EnrollmentToken.objects.filter(cluster=cluster).order_by("-created")[:10],
        "live_groups": [cluster_group(cluster.organization_id, cluster.pk)],
        "status": cluster_status(cluster),
    })


def _without_access_links(topology):
    from workers.fabric.topology import Topology

    links = tuple(link for link in topology.links if topology.is_switch(link.a) and topology.is_switch(link.b))
    return Topology(name=topology.name, hosts=topology.hosts, switches=topology.switches, nics=(), links=links)


def _create_enrollment_token(request, cluster: Cluster) -> dict | None:
    from datetime import timedelta

    from django.utils import timezone

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
        description=request.POST.get("description", "")[:200], expires=timezone.now() + timedelta(hours=hours),
        max_uses=max_uses,
    )
    plaintext = token.set_new_secret()
    token.save()
    return {"token": plaintext, "install_command": install_command(request, plaintext), "expires": token.expires}


@login_required
def cluster_status_json(request, pk: int):
    return JsonResponse(cluster_status(_cluster_or_404(request, pk)))

