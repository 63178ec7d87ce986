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


class Migration(migrations.Migration):

    dependencies = [
        ("clocks", "0001_initial"),
        ("fleet", "0002_tenant_keys"),
    ]

    operations = [
        composite_foreign_keys(
            CompositeKey("clocks.ClockSync", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("clocks.ClockSync", ("reference_id", "cluster_id", "organization_id"), "fleet.Node",
                         NODE_PLACEMENT),
            CompositeKey("clocks.NodeClock", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("clocks.PairEstimate", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("clocks.PairEstimate", ("peer_id", "cluster_id", "organization_id"), "fleet.Node",
                         NODE_PLACEMENT),
        ),
    ]
