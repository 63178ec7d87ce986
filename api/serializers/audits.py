from __future__ import annotations

from collections import Counter

from rest_framework import serializers

from console.audits.models import AuditFinding, AuditNode, AuditRun, AuditSchedule, NodeOutcome, Verdict


class AuditStartSerializer(serializers.Serializer):
    """What POST /clusters/{id}/audits/ takes; the options are checked by console.audits.services."""

    nodes = serializers.ListField(child=serializers.IntegerField(), required=False, max_length=100000,
                                  help_text="Node ids to audit (default: every node of the cluster).")
    options = serializers.JSONField(required=False, default=dict,
                                    help_text="Audit options (console.audits.services.OPTIONS).")
    idempotency_key = serializers.CharField(max_length=100, required=False, allow_null=True)


class AuditNodeSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = AuditNode
        fields = ["node", "name", "outcome", "reason"]
        read_only_fields = fields


class AuditFindingSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditFinding
        fields = ["id", "phase", "element_kind", "element", "check_name", "status", "culprit", "code", "severity",
                  "message", "action", "evidence", "threshold"]
        read_only_fields = fields


class AuditRunSerializer(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField(help_text="Nodes by outcome so far.")
    culprits = serializers.SerializerMethodField(help_text="The elements the audit names, with why.")
    verdict = serializers.ChoiceField(choices=Verdict.choices, allow_blank=True, read_only=True,
                                      help_text="Empty until the audit has finished.")

    class Meta:
        model = AuditRun
        fields = ["id", "organization", "cluster", "state", "phase", "verdict", "trigger", "options", "plan",
                  "progress", "culprits", "idempotency_key", "created", "finished_at", "error"]
        read_only_fields = fields

    def get_progress(self, run) -> dict:
        counts = Counter(n.outcome for n in run.nodes.all())
        return {k: counts.get(k, 0) for k in NodeOutcome.values} | {"total": sum(counts.values())}

    def get_culprits(self, run) -> list:
        return (run.report or {}).get("culprits", [])


class AuditRunDetailSerializer(AuditRunSerializer):
    nodes = AuditNodeSerializer(many=True, read_only=True)
    findings = AuditFindingSerializer(many=True, read_only=True)

    class Meta(AuditRunSerializer.Meta):
        fields = [*AuditRunSerializer.Meta.fields, "nodes", "findings"]
        read_only_fields = fields


class AuditScheduleSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditSchedule
        fields = ["cluster", "interval_s", "enabled", "options", "next_at", "last_run"]
        read_only_fields = ["cluster", "next_at", "last_run"]
