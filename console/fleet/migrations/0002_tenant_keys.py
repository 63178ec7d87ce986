"""Rows agree with their parents on organization, cluster and node (console.core.tenant_keys)."""

from django.db import migrations, models

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
        ('fleet', '0001_initial'),
        ('tenancy', '0001_initial'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='cluster',
            constraint=models.UniqueConstraint(fields=('id', 'organization'), name='fleet_cluster_unique_id_organization'),
        ),
        migrations.AddConstraint(
            model_name='nic',
            constraint=models.UniqueConstraint(fields=('id', 'cluster'), name='fleet_nic_unique_id_cluster'),
        ),
        migrations.AddConstraint(
            model_name='nic',
            constraint=models.UniqueConstraint(fields=('id', 'node'), name='fleet_nic_unique_id_node'),
        ),
        migrations.AddConstraint(
            model_name='node',
            constraint=models.UniqueConstraint(fields=('id', 'cluster', 'organization'), name='fleet_node_unique_id_placement'),
        ),
        migrations.AddConstraint(
            model_name='switch',
            constraint=models.UniqueConstraint(fields=('id', 'cluster'), name='fleet_switch_unique_id_cluster'),
        ),
        composite_foreign_keys(
            CompositeKey("fleet.Node", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("fleet.Switch", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("fleet.EnrollmentToken", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("fleet.Link", CLUSTER_PLACEMENT, "fleet.Cluster", CLUSTER_KEY),
            CompositeKey("fleet.Nic", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("fleet.Gpu", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("fleet.NodeCredential", PLACEMENT, "fleet.Node", NODE_PLACEMENT),
            CompositeKey("fleet.Gpu", ("nearest_nic_id", "node_id"), "fleet.Nic", ("id", "node_id")),
            CompositeKey("fleet.Link", ("a_nic_id", "cluster_id"), "fleet.Nic", ("id", "cluster_id")),
            CompositeKey("fleet.Link", ("b_nic_id", "cluster_id"), "fleet.Nic", ("id", "cluster_id")),
            CompositeKey("fleet.Link", ("a_switch_id", "cluster_id"), "fleet.Switch", ("id", "cluster_id")),
            CompositeKey("fleet.Link", ("b_switch_id", "cluster_id"), "fleet.Switch", ("id", "cluster_id")),
        ),
    ]
