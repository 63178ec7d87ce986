"""Query filters for list endpoints (django-filter)."""

from __future__ import annotations

from datetime import timezone as dt_timezone

import django_filters as filters
from django import forms
from django.db import models
from rest_framework import exceptions
from rest_framework.filters import OrderingFilter

from console.audits.models import AuditRun, RunState, Verdict
from console.clocks.models import ClockState, ClockSync, NodeClock, PairEstimate
from console.commands.models import Command, CommandState
from console.fleet.models import Cluster, EnrollmentToken, Gpu, Link, Nic, Node, NodeState, Switch
from console.incidents.models import Incident, IncidentState, ProbePlan, ProbeWindow, WindowState
from console.jobs.models import Job, JobCapture, PathEvent, WeightVersion
from console.telemetry.models import TelemetryRecord
from console.tenancy.models import ApiToken, Membership, Role


class IntegerFilter(filters.NumberFilter):
    """A whole number: django-filter's NumberFilter takes any decimal (`?version=2.2e-313`)."""

    field_class = forms.IntegerField


class StrictBooleanField(forms.NullBooleanField):
    """`true`/`false` (or 1/0): django-filter's boolean takes any other value as "not given"."""

    widget = forms.TextInput  # the select widget would turn an unknown value into None first

    def to_python(self, value):
        if value in (None, ""):
            return None
        text = str(value).lower()
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise forms.ValidationError(f"{value!r} is not true or false")

    def validate(self, value):
        pass


class StrictBooleanFilter(filters.BooleanFilter):
    field_class = StrictBooleanField


class StrictFilterSet(filters.FilterSet):
    """A filter that takes one value is given one, and a value: `?cluster=1&cluster=2` and
    `?cluster=` are a 400 naming the parameter (django-filter would use the last, or none)."""

    FILTER_DEFAULTS = {
        **filters.FilterSet.FILTER_DEFAULTS,
        **{field: {"filter_class": IntegerFilter} for field in (
            models.IntegerField, models.BigIntegerField, models.SmallIntegerField, models.PositiveIntegerField,
            models.PositiveBigIntegerField, models.PositiveSmallIntegerField)},
        models.BooleanField: {"filter_class": StrictBooleanFilter},
    }

    def is_valid(self):
        valid = super().is_valid()
        given = getattr(self.data, "getlist", None)
        for name, declared in self.filters.items() if given else ():
            multiple = isinstance(declared, (filters.MultipleChoiceFilter, filters.ModelMultipleChoiceFilter))
            values = given(name)
            if not multiple and len(values) > 1:
                self.form.add_error(name, "given more than once")
                valid = False
            elif "" in values and not isinstance(declared, filters.CharFilter):
                # `?kind=` would quietly filter nothing: an unset variable in a script lists everything.
                self.form.add_error(name, "empty: give a value, or leave the parameter out")
                valid = False
        return valid


class StrictOrderingFilter(OrderingFilter):
    """`?ordering=` names columns of the listed rows, or is a 400 saying which it may name (DRF
    would order by any readable serializer field, a computed one included: a 500)."""

    def get_valid_fields(self, queryset, view, context=None):
        fields = super().get_valid_fields(queryset, view, context or {})
        model = queryset.model
        concrete = {f.name for f in model._meta.concrete_fields} | {f.attname for f in model._meta.concrete_fields}
        annotated = set(getattr(queryset.query, "annotations", {}))
        return [(name, label) for name, label in fields if name in concrete | annotated]

    def get_ordering(self, request, queryset, view):
        if len(request.query_params.getlist(self.ordering_param)) > 1:
            raise exceptions.ValidationError({self.ordering_param: "given more than once (separate fields by commas)"})
        return super().get_ordering(request, queryset, view)

    def remove_invalid_fields(self, queryset, fields, view, request):
        valid = {name for name, _ in self.get_valid_fields(queryset, view, {"request": request})}
        wrong = [term for term in fields if term.lstrip("-") not in valid]
        if wrong:
            raise exceptions.ValidationError(
                {self.ordering_param: f"cannot order by {', '.join(wrong)}; choose from {', '.join(sorted(valid))}"})
        return list(fields)


class StrictIsoDateTimeField(filters.fields.IsoDateTimeField):
    """An ISO 8601 time that exists in UTC too: 9999-12-31T23:59:59-23:59 does not (it overflows
    when the query compares it), and is a 400 naming the parameter."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is not None and parsed.tzinfo is not None:
            try:
                parsed.astimezone(dt_timezone.utc)
            except OverflowError:
                raise forms.ValidationError(f"{value!r} is outside the times that can be compared") from None
        return parsed


class StrictIsoDateTimeFilter(filters.IsoDateTimeFilter):
    field_class = StrictIsoDateTimeField


class ClusterFilterSet(StrictFilterSet):
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Cluster
        fields = ["organization", "name"]


class NodeFilterSet(StrictFilterSet):
    state = filters.MultipleChoiceFilter(choices=NodeState.choices)
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["organization", "cluster", "state", "in_topology", "name", "machine_id"]


class GpuFilterSet(StrictFilterSet):
    class Meta:
        model = Gpu
        fields = ["cluster", "node", "uuid", "health"]


class NicFilterSet(StrictFilterSet):
    class Meta:
        model = Nic
        fields = ["cluster", "node", "rail", "in_topology", "kind", "health", "link_state"]


class SwitchFilterSet(StrictFilterSet):
    class Meta:
        model = Switch
        fields = ["cluster", "tier", "health"]


class LinkFilterSet(StrictFilterSet):
    class Meta:
        model = Link
        fields = ["cluster", "health", "name"]


class EnrollmentTokenFilterSet(StrictFilterSet):
    class Meta:
        model = EnrollmentToken
        fields = ["cluster"]


class CommandFilterSet(StrictFilterSet):
    state = filters.MultipleChoiceFilter(choices=CommandState.choices)

    class Meta:
        model = Command
        fields = ["cluster", "node", "type", "state"]


class MembershipFilterSet(StrictFilterSet):
    role = filters.ChoiceFilter(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["organization", "role"]


class ApiTokenFilterSet(StrictFilterSet):
    class Meta:
        model = ApiToken
        fields = ["organization", "scope"]


class TelemetryRecordFilterSet(StrictFilterSet):
    since = StrictIsoDateTimeFilter(field_name="ts", lookup_expr="gte")
    until = StrictIsoDateTimeFilter(field_name="ts", lookup_expr="lt")

    class Meta:
        model = TelemetryRecord
        fields = ["cluster", "node", "kind", "since", "until"]


class AuditRunFilterSet(StrictFilterSet):
    state = filters.MultipleChoiceFilter(choices=RunState.choices)
    verdict = filters.MultipleChoiceFilter(choices=Verdict.choices)

    class Meta:
        model = AuditRun
        fields = ["cluster", "state", "verdict", "trigger"]


class ClockSyncFilterSet(StrictFilterSet):
    class Meta:
        model = ClockSync
        fields = ["cluster", "running"]


class NodeClockFilterSet(StrictFilterSet):
    state = filters.MultipleChoiceFilter(choices=ClockState.choices)

    class Meta:
        model = NodeClock
        fields = ["cluster", "node", "state"]


class PairEstimateFilterSet(StrictFilterSet):
    class Meta:
        model = PairEstimate
        fields = ["cluster", "node", "peer", "flagged"]


class JobFilterSet(StrictFilterSet):
    name = filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Job
        fields = ["organization", "cluster", "node", "name"]


class JobCaptureFilterSet(StrictFilterSet):
    class Meta:
        model = JobCapture
        fields = ["cluster", "job", "kind"]


class WeightVersionFilterSet(StrictFilterSet):
    class Meta:
        model = WeightVersion
        fields = ["cluster", "job", "publisher", "version"]


class PathEventFilterSet(StrictFilterSet):
    class Meta:
        model = PathEvent
        fields = ["cluster", "node", "kind", "comm"]


class IncidentFilterSet(StrictFilterSet):
    state = filters.MultipleChoiceFilter(choices=IncidentState.choices)
    culprit = filters.CharFilter(help_text="The culprit element's name (a link id, switch, NIC or host).")
    since = StrictIsoDateTimeFilter(field_name="last_seen", lookup_expr="gte", help_text="Last seen at or after.")
    until = StrictIsoDateTimeFilter(field_name="first_seen", lookup_expr="lte", help_text="First seen at or before.")

    class Meta:
        model = Incident
        fields = ["cluster", "state", "kind", "culprit", "network_ok"]


class ProbeWindowFilterSet(StrictFilterSet):
    state = filters.MultipleChoiceFilter(choices=WindowState.choices)

    class Meta:
        model = ProbeWindow
        fields = ["cluster", "state", "network_ok"]


class ProbePlanFilterSet(StrictFilterSet):
    class Meta:
        model = ProbePlan
        fields = ["cluster"]
