"""Rows agree with their parents on organization and cluster (console.core.tenant_keys)."""

from django.db import migrations

from console.core.tenant_keys import CLUSTER_KEY, CLUSTER_PLACEMENT, CompositeKey, composite_foreign_keys


class Migration(migrations.Migration):

    dependencies = [
        ("incidents", "0001_initial"),
        ("fleet", "0002_tenant_keys"),
    ]

    operations = [
        composite_foreign_keys(
            CompositeKey("incidents.ProbeWindow", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("incidents.Incident", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("incidents.IncidentEvent", ("incident_id", *CLUSTER_PLACEMENT), "incidents.Incident",
                         ("id", *CLUSTER_PLACEMENT)),
            CompositeKey("incidents.IncidentTracker", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("incidents.ProbePlan", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
        ),
    ]
