from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from api.agent import views as agent_views
from api.views.audits import AuditRunViewSet
from api.views.clocks import ClockSyncViewSet, NodeClockViewSet, PairEstimateViewSet
from api.views.commands import CommandTypeViewSet, CommandViewSet
from api.views.fleet import (
    ClusterViewSet,
    EnrollmentTokenViewSet,
    GpuViewSet,
    LinkViewSet,
    NicViewSet,
    NodeViewSet,
    SwitchViewSet,
)
from api.views.incidents import IncidentViewSet, ProbePlanViewSet, ProbeWindowViewSet
from api.views.jobs import JobCaptureViewSet, JobViewSet, PathEventViewSet, WeightVersionViewSet
from api.views.telemetry import TelemetryRecordViewSet
from api.views.tenancy import ApiTokenViewSet, MembershipViewSet, OrganizationViewSet

router = DefaultRouter()
router.register("organizations", OrganizationViewSet, basename="organization")
router.register("members", MembershipViewSet, basename="membership")
router.register("tokens", ApiTokenViewSet, basename="apitoken")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("nics", NicViewSet, basename="nic")
router.register("switches", SwitchViewSet, basename="switch")
router.register("links", LinkViewSet, basename="link")
router.register("enrollment-tokens", EnrollmentTokenViewSet, basename="enrollmenttoken")
router.register("commands", CommandViewSet, basename="command")
router.register("command-types", CommandTypeViewSet, basename="commandtype")
router.register("telemetry", TelemetryRecordViewSet, basename="telemetryrecord")
router.register("audits", AuditRunViewSet, basename="auditrun")
router.register("clock-syncs", ClockSyncViewSet, basename="clocksync")
router.register("node-clocks", NodeClockViewSet, basename="nodeclock")
router.register("clock-pairs", PairEstimateViewSet, basename="pairestimate")
router.register("jobs", JobViewSet, basename="job")
router.register("job-captures", JobCaptureViewSet, basename="jobcapture")
router.register("weight-versions", WeightVersionViewSet, basename="weightversion")
router.register("path-events", PathEventViewSet, basename="pathevent")
router.register("incidents", IncidentViewSet, basename="incident")
router.register("probe-windows", ProbeWindowViewSet, basename="probewindow")
router.register("probe-plans", ProbePlanViewSet, basename="probeplan")

agent_urls = [
    path("enroll", agent_views.enroll, name="agent-enroll"),
    path("heartbeat", agent_views.heartbeat, name="agent-heartbeat"),
    path("commands", agent_views.poll_commands, name="agent-commands"),
    path("commands/<uuid:command_id>/result", agent_views.command_result, name="agent-command-result"),
    path("telemetry", agent_views.telemetry, name="agent-telemetry"),
    path("inventory", agent_views.inventory, name="agent-inventory"),
]

urlpatterns = [
    path("agent/", include(agent_urls)),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("", include(router.urls)),
]
