"""Query filters for list endpoints (django-filter)."""

from __future__ import annotations

import django_filters as filters

from console.commands.models import Command, CommandState
from console.fleet.models import Cluster, EnrollmentToken, Gpu, Link, Nic, Node, NodeState, Switch
from console.incidents.models import Incident, IncidentState, ProbePlan, ProbeWindow, WindowState
from console.telemetry.models import TelemetryRecord
from console.tenancy.models import ApiToken, Membership, Role


class ClusterFilterSet(filters.FilterSet):
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Cluster
        fields = ["organization", "name"]


class NodeFilterSet(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=NodeState.choices)
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["organization", "cluster", "state", "in_topology", "name", "machine_id"]


class GpuFilterSet(filters.FilterSet):
    class Meta:
        model = Gpu
        fields = ["cluster", "node", "uuid", "health"]


class NicFilterSet(filters.FilterSet):
    class Meta:
        model = Nic
        fields = ["cluster", "node", "rail", "in_topology", "kind", "health", "link_state"]


class SwitchFilterSet(filters.FilterSet):
    class Meta:
        model = Switch
        fields = ["cluster", "tier", "health"]


class LinkFilterSet(filters.FilterSet):
    class Meta:
        model = Link
        fields = ["cluster", "health", "name"]


class EnrollmentTokenFilterSet(filters.FilterSet):
    class Meta:
        model = EnrollmentToken
        fields = ["cluster"]


class CommandFilterSet(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=CommandState.choices)

    class Meta:
        model = Command
        fields = ["cluster", "node", "type", "state"]


class MembershipFilterSet(filters.FilterSet):
    role = filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["organization", "role"]


class ApiTokenFilterSet(filters.FilterSet):
    class Meta:
        model = ApiToken
        fields = ["organization", "scope"]


class TelemetryRecordFilterSet(filters.FilterSet):
    since = filters.IsoDateTimeFilter(field_name="ts", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="ts", lookup_expr="lt")

    class Meta:
        model = TelemetryRecord
        fields = ["cluster", "node", "kind", "since", "until"]


class IncidentFilterSet(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=IncidentState.choices)
    culprit = filters.CharFilter(help_text="The culprit element's name (a link id, switch, NIC or host).")
    since = filters.IsoDateTimeFilter(field_name="last_seen", lookup_expr="gte", help_text="Last seen at or after.")
    until = filters.IsoDateTimeFilter(field_name="first_seen", lookup_expr="lte", help_text="First seen at or before.")

    class Meta:
        model = Incident
        fields = ["cluster", "state", "kind", "culprit", "network_ok"]


class ProbeWindowFilterSet(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=WindowState.choices)

    class Meta:
        model = ProbeWindow
        fields = ["cluster", "state", "network_ok"]


class ProbePlanFilterSet(filters.FilterSet):
    class Meta:
        model = ProbePlan
        fields = ["cluster"]
