"""Prometheus metrics of the console, served at `/metrics` (prometheus-client).

What is measured, and where:

| metric | kind | labels | set by |
| --- | --- | --- | --- |
| `lockstep_nodes` | gauge | organization_id, state | the database, at each scrape |
| `lockstep_organization_info` | gauge (1) | organization_id, slug | the database, at each scrape (join on it for names) |
| `lockstep_agent_polls_held` | gauge | | `api.agent.views.poll_commands` |
| `lockstep_command_delivery_seconds` | histogram | | `console.commands.services.claim` (issue → first delivery) |
| `lockstep_telemetry_records_total` | counter | organization_id, kind | `console.telemetry.services.ingest` |
| `lockstep_telemetry_batches_total` | counter | organization_id, outcome (stored, duplicate) | same |
| `lockstep_telemetry_rejects_total` | counter | organization_id, reason | `api.agent.views.telemetry` |
| `lockstep_telemetry_handler_errors_total` | counter | kind | `console.telemetry.kinds` (a handler raised) |
| `lockstep_clock_worst_bound_ns`, `lockstep_clock_nodes_synced`, `lockstep_clock_nodes_planned` | gauge | organization_id, cluster_id | the database, at each scrape (`console/clocks/metrics.py`) |

Node counts come from the database, so every console process reports the same numbers.
Counters, the gauge of held polls and the histogram are per process: the console normally runs
as one uvicorn process (it serves thousands of long polls on one event loop), and then that is
the whole picture. With several processes, set `PROMETHEUS_MULTIPROC_DIR` to an empty directory
they can all write (emptied before they start): the view then adds up every process's values.

Access: a bearer token (`LOCKSTEP_METRICS_TOKEN`, or `LOCKSTEP_METRICS_TOKEN_FILE`) or a client
address in `LOCKSTEP_METRICS_ALLOW` (CIDRs; default loopback only). Anything else is 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

POLLS_HELD = Gauge(
    "lockstep_agent_polls_held", "Long polls of agents this console process is holding open.",
    multiprocess_mode="livesum",
)
COMMAND_DELIVERY_SECONDS = Histogram(
    "lockstep_command_delivery_seconds", "Seconds from a command's issue to its first delivery to the agent.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
TELEMETRY_RECORDS = Counter(
    "lockstep_telemetry_records", "Telemetry records stored, by organization and kind.", ["organization_id", "kind"],
)
TELEMETRY_BATCHES = Counter(
    "lockstep_telemetry_batches", "Telemetry batches accepted: stored, or a duplicate of one stored before.",
    ["organization_id", "outcome"],
)
TELEMETRY_REJECTS = Counter(
    "lockstep_telemetry_rejects", "Telemetry batches refused, by reason (invalid, unknown_kind, too_large, busy, "
    "unauthenticated); organization_id is empty when the credential did not hold.", ["organization_id", "reason"],
)
TELEMETRY_HANDLER_ERRORS = Counter(
    "lockstep_telemetry_handler_errors", "Telemetry-kind handlers that raised after their batch was stored.", ["kind"],
)


class FleetCollector(Collector):
    """Node counts by organization and state, read from the database at each scrape."""

    def describe(self):
        return [self._nodes(), self._organizations()]

    @staticmethod
    def _nodes() -> GaugeMetricFamily:
        return GaugeMetricFamily("lockstep_nodes", "Nodes by organization and state.",
                                 labels=["organization_id", "state"])

    @staticmethod
    def _organizations() -> GaugeMetricFamily:
        return GaugeMetricFamily("lockstep_organization_info", "Organizations (always 1), to name organization_id.",
                                 labels=["organization_id", "slug"])

    def collect(self):
        from django.db.models import Count

        from console.core import scoping
        from console.fleet.models import Node, NodeState
        from console.tenancy.models import Organization

        nodes, organizations = self._nodes(), self._organizations()
        with scoping.unscoped("metrics: node counts of every organization"):
            slugs = dict(Organization.objects.values_list("id", "slug"))
            counts = {(row["organization_id"], row["state"]): row["n"] for row in
                      Node.objects.values("organization_id", "state").annotate(n=Count("id")).order_by()}
        for org_id, slug in sorted(slugs.items()):
            organizations.add_metric([str(org_id), slug], 1)
            for state in NodeState.values:
                nodes.add_metric([str(org_id), state], counts.get((org_id, state), 0))
        yield nodes
        yield organizations


FLEET = FleetCollector()
_DATABASE_COLLECTORS: list[Collector] = []


def register_database_collector(collector: Collector) -> None:
    """A collector that reads the database at each scrape (the same in every process): served once."""
    _DATABASE_COLLECTORS.append(collector)
    if not MULTIPROCESS:
        REGISTRY.register(collector)


register_database_collector(FLEET)


def _registry() -> CollectorRegistry:
    if not MULTIPROCESS:
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    for collector in _DATABASE_COLLECTORS:
        registry.register(collector)
    return registry


def _allowed(request) -> bool:
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme == "Bearer" and hmac.compare_digest(presented.strip().encode(), token.encode()):
            return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in settings.METRICS_ALLOW)


@require_safe
def metrics_view(request):
    if not _allowed(request):
        return JsonResponse(
            {"error": "permission_denied", "detail": "Metrics need 'Authorization: Bearer <LOCKSTEP_METRICS_TOKEN>' "
                                                     "or a client address in LOCKSTEP_METRICS_ALLOW."},
            status=403,
        )
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(_registry()), content_type=content_type)
