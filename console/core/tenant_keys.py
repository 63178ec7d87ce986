"""Composite foreign keys that make the database refuse a child row placed outside its parent.

`TenantOwned.save()` and `bulk_create()` check that a child names its parent's organization
(and cluster, and node); on PostgreSQL the database enforces it as well, with foreign keys over
the tenant columns: `fleet_nic (node_id, cluster_id, organization_id) → fleet_node (id,
cluster_id, organization_id)`. Django cannot declare these (a ForeignKey is one column), so
migrations add them with `composite_foreign_keys(...)`. They are deferrable, like Django's own.

On SQLite (the embedded defaults) only the check on save applies: SQLite cannot add a foreign
key to an existing table, and the triggers that could stand in for one are dropped whenever
Django rebuilds a table in a later migration.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import migrations


@dataclass(frozen=True)
class CompositeKey:
    model: str  # "app_label.Model" of the child
    columns: tuple[str, ...]
    parent: str  # "app_label.Model"
    parent_columns: tuple[str, ...]

    def name(self, table: str) -> str:
        # PostgreSQL identifiers stop at 63 bytes.
        return f"{table}_{'_'.join(c.removesuffix('_id') for c in self.columns)}_placement"[:63]


def composite_foreign_keys(*keys: CompositeKey) -> migrations.RunPython:
    def forwards(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        quote = schema_editor.quote_name
        for key in keys:
            table = apps.get_model(key.model)._meta.db_table
            parent = apps.get_model(key.parent)._meta.db_table
            schema_editor.execute(
                f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(key.name(table))} "
                f"FOREIGN KEY ({', '.join(map(quote, key.columns))}) "
                f"REFERENCES {quote(parent)} ({', '.join(map(quote, key.parent_columns))}) "
                "DEFERRABLE INITIALLY DEFERRED"
            )

    def backwards(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        quote = schema_editor.quote_name
        for key in keys:
            table = apps.get_model(key.model)._meta.db_table
            schema_editor.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(key.name(table))}")

    return migrations.RunPython(forwards, backwards, elidable=False)


PLACEMENT = ("node_id", "cluster_id", "organization_id")
NODE_PLACEMENT = ("id", "cluster_id", "organization_id")
CLUSTER_PLACEMENT = ("cluster_id", "organization_id")
CLUSTER_KEY = ("id", "organization_id")
