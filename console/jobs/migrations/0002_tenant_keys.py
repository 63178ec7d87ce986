"""Rows agree with their parents on organization, cluster and node (console.core.tenant_keys)."""

from django.db import migrations

from console.core.tenant_keys import NODE_PLACEMENT, PLACEMENT, CompositeKey, composite_foreign_keys

JOB_PLACEMENT = ("job_id", "cluster_id", "organization_id")
JOB_KEY = ("id", "cluster_id", "organization_id")


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0002_tenant_keys'),
        ('jobs', '0001_initial'),
    ]

    operations = [
        composite_foreign_keys(
            CompositeKey("jobs.Job", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("jobs.JobCapture", JOB_PLACEMENT, "jobs.Job", JOB_KEY),
            CompositeKey("jobs.WeightVersion", JOB_PLACEMENT, "jobs.Job", JOB_KEY),
            CompositeKey("jobs.PathEvent", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
        ),
    ]
