from api.filtersets import JobCaptureFilterSet, JobFilterSet, PathEventFilterSet, WeightVersionFilterSet
from api.serializers.jobs import (
    JobCaptureSerializer,
    JobSerializer,
    PathEventSerializer,
    WeightVersionSerializer,
)
from api.viewsets import ScopedReadOnlyViewSet
from console.jobs.models import Job, JobCapture, PathEvent, WeightVersion


class JobViewSet(ScopedReadOnlyViewSet):
    """Training jobs run under `lockstep run`, as the nodes' agents report them."""

    model = Job
    serializer_class = JobSerializer
    filterset_class = JobFilterSet
    ordering_fields = ["name", "last_seen", "created"]


class JobCaptureViewSet(ScopedReadOnlyViewSet):
    """Snapshots and checkpoints of jobs (newest first): step, size, pause, duration, where stored."""

    model = JobCapture
    serializer_class = JobCaptureSerializer
    filterset_class = JobCaptureFilterSet


class WeightVersionViewSet(ScopedReadOnlyViewSet):
    """Weight versions pushed to rollout replicas (newest first), and which replica held which."""

    model = WeightVersion
    serializer_class = WeightVersionSerializer
    filterset_class = WeightVersionFilterSet


class PathEventViewSet(ScopedReadOnlyViewSet):
    """The NCCL plugin's failovers and failbacks, per node (newest first)."""

    model = PathEvent
    serializer_class = PathEventSerializer
    filterset_class = PathEventFilterSet
