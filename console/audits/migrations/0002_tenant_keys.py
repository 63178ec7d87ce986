"""Rows agree with their parents on organization, cluster and node (console.core.tenant_keys)."""

from django.db import migrations

from console.core.tenant_keys import (
    CLUSTER_KEY,
    CLUSTER_PLACEMENT,
    NODE_PLACEMENT,
    PLACEMENT,
    CompositeKey,
    composite_foreign_keys,
)

RUN_PLACEMENT = ("run_id", "cluster_id", "organization_id")
RUN_KEY = ("id", "cluster_id", "organization_id")


class Migration(migrations.Migration):

    dependencies = [
        ("audits", "0001_initial"),
        ("fleet", "0002_tenant_keys"),
    ]

    operations = [
        composite_foreign_keys(
            CompositeKey("audits.AuditRun", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("audits.AuditSchedule", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("audits.AuditNode", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("audits.AuditNode", RUN_PLACEMENT, "audits.AuditRun", RUN_KEY),
            CompositeKey("audits.AuditFinding", RUN_PLACEMENT, "audits.AuditRun", RUN_KEY),
        ),
    ]
