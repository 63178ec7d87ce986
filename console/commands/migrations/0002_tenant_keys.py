"""Rows agree with their parents on organization, cluster and node (console.core.tenant_keys)."""

from django.db import migrations

from console.core.tenant_keys import NODE_PLACEMENT, PLACEMENT, CompositeKey, composite_foreign_keys


class Migration(migrations.Migration):

    dependencies = [
        ("commands", "0001_initial"),
        ("fleet", "0002_tenant_keys"),
    ]

    operations = [
        composite_foreign_keys(
            CompositeKey("commands.Command", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
        ),
    ]
