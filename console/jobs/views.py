"""Pages: a cluster's jobs (with the NCCL plugin's path events by node) and one job's page
(its snapshots, checkpoints and weight versions). Live: the cluster's group hears every change
(``console.jobs.services``), and ``live.js`` refreshes the ``data-refresh-region`` tables."""

from __future__ import annotations

from django.db.models import Count
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.jobs.models import Job, PathEvent
from console.live.groups import cluster_group
from console.web.views import _cluster_or_404, tenant_view

SHOWN = 50


@tenant_view
@require_GET
def cluster_jobs(request, pk: int):
    cluster = _cluster_or_404(request, pk)
    jobs = (Job.objects.filter(cluster=cluster).select_related("node")
            .annotate(capture_count=Count("captures", distinct=True),
                      version_count=Count("weight_versions", distinct=True)).order_by("name"))
    return render(request, "web/jobs.html", {
        "cluster": cluster,
        "jobs": jobs,
        "path_events": PathEvent.objects.filter(cluster=cluster).select_related("node")[:SHOWN],
        "live_groups": [cluster_group(cluster.organization_id, cluster.pk)],
    })


@tenant_view
@require_GET
def job(request, job_pk: int):
    found = Job.objects.filter(pk=job_pk).select_related("node", "cluster").first()
    if found is None:
        raise Http404("No such job.")
    return render(request, "web/job.html", {
        "job": found,
        "captures": found.captures.all()[:SHOWN],
        "versions": found.weight_versions.all()[:SHOWN],
        "live_groups": [cluster_group(found.organization_id, found.cluster_id)],
    })
