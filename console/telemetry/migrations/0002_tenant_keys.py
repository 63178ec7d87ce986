"""Rows agree with their parents on organization, cluster and node (console.core.tenant_keys)."""

from django.db import migrations, models

from console.core.tenant_keys import NODE_PLACEMENT, PLACEMENT, CompositeKey, composite_foreign_keys


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0002_tenant_keys'),
        ('telemetry', '0001_initial'),
        ('tenancy', '0001_initial'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='telemetrybatch',
            constraint=models.UniqueConstraint(fields=('id', 'node', 'cluster', 'organization'), name='telemetry_telemetrybatch_unique_id_placement'),
        ),
        composite_foreign_keys(
            CompositeKey("telemetry.TelemetryBatch", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("telemetry.TelemetryRecord", ("batch_id", *PLACEMENT), "telemetry.TelemetryBatch",
                         ("id", *PLACEMENT)),
        ),
    ]
