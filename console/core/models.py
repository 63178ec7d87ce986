"""Abstract base models every Lockstep table builds on, and tenant scoping of their queries.

`TimestampedModel` → `OrganizationOwnedModel` (a non-null organization on every domain row)
→ `ClusterOwnedModel` (organization and cluster denormalized, so tenant and cluster filters
never need deep joins). Constraint names follow `%(app_label)s_%(class)s_<what>`.

Tenant scoping fails closed (see `console.core.scoping`): the default manager of every
tenant-owned model (`TenantOwned`) filters by the active scope, and raises `TenantScopeError`
when a query would run with none. The filter is applied when the queryset is made (or cloned)
inside a scope; a queryset made outside any scope (a module-level one, a django-filter or DRF
field's class-level `queryset`) stays *pending* and takes the scope in force when it is cloned
or run, so related fields and filter choices are scoped by the same mechanism. The base manager
(`_base_manager`: what Django uses for `obj.parent`, cascades and `refresh_from_db`) stays
plain: it is only ever reached from a row that was already scoped.

Writes are checked too: `save()`, `delete()` and `bulk_create()` refuse rows of organizations
outside the active scope, and a child row must name the same organization (and cluster, and
node) as each of its parents (`tenant_parents`), checked on save and in bulk; PostgreSQL also
enforces it with composite foreign keys (migrations named `*_tenant_keys`).
"""

from __future__ import annotations

from django.db import models

from console.core import scoping
from console.core.scoping import TenantMismatch, TenantScopeError

# Columns that place a row in the tenant hierarchy, outermost first.
TENANT_COLUMNS = ("organization_id", "cluster_id", "node_id")
# The largest `pk__in` list one consistency query sends (SQLite's variable limit is 999 on old builds).
_IN_CHUNK = 900


class TenantQuerySet(models.QuerySet):
    """A queryset that carries the tenant scope, or waits for one (`_tenant_pending`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tenant_pending = False
        self._tenant_columns_checked = False

    # -- the scope ----------------------------------------------------------------------------

    def _apply_tenant_scope(self) -> None:
        """Filter by the active scope now (in place); raise when there is none."""
        if not self._tenant_pending:
            return
        scope = scoping.active()
        if scope is None:
            if self.query.is_empty():  # .none(): nothing to hide, no query runs
                self._tenant_pending = False
                return
            raise TenantScopeError(
                f"{self.model._meta.label} queried with no tenant scope active. The entry point must "
                "enter one: a viewset or page does it for its caller; agent endpoints, Celery tasks "
                "and management commands say for_organization(id) or unscoped('why')."
            )
        if not scope.is_unscoped:
            self._filter_or_exclude_inplace(
                False, (), {f"{self.model.tenant_field}__in": sorted(scope.organization_ids)}
            )
        self._tenant_pending = False

    def _clone(self):
        clone = super()._clone()
        clone._tenant_pending = self._tenant_pending
        clone._tenant_columns_checked = self._tenant_columns_checked
        if clone._tenant_pending and scoping.active() is not None:
            clone._apply_tenant_scope()
        return clone

    def _combined(self, result, other):
        if self._tenant_pending or getattr(other, "_tenant_pending", False):
            result._tenant_pending = True  # the scope then applies to the whole combination
            if scoping.active() is not None:
                result._apply_tenant_scope()
        return result

    def __and__(self, other):
        return self._combined(super().__and__(other), other)

    def __or__(self, other):
        return self._combined(super().__or__(other), other)

    def __xor__(self, other):
        return self._combined(super().__xor__(other), other)

    def _combinator_query(self, combinator, *other_qs, all=False):
        for qs in (self, *other_qs):
            if isinstance(qs, TenantQuerySet):
                qs._apply_tenant_scope()
        return super()._combinator_query(combinator, *other_qs, all=all)

    # -- everything that runs SQL ---------------------------------------------------------------

    def _fetch_all(self):
        self._apply_tenant_scope()
        super()._fetch_all()

    def _iterator(self, use_chunked_fetch, chunk_size):
        self._apply_tenant_scope()
        yield from super()._iterator(use_chunked_fetch, chunk_size)

    async def aiterator(self, chunk_size=2000):
        self._apply_tenant_scope()
        async for row in super().aiterator(chunk_size):
            yield row

    def count(self):
        self._apply_tenant_scope()
        return super().count()

    def exists(self):
        self._apply_tenant_scope()
        return super().exists()

    def aggregate(self, *args, **kwargs):
        self._apply_tenant_scope()
        return super().aggregate(*args, **kwargs)

    def explain(self, **options):
        self._apply_tenant_scope()
        return super().explain(**options)

    def resolve_expression(self, *args, **kwargs):  # used as a subquery: `cluster__in=Cluster.objects...`
        self._apply_tenant_scope()
        return super().resolve_expression(*args, **kwargs)

    def delete(self):
        self._apply_tenant_scope()
        return super().delete()

    delete.alters_data = True
    delete.queryset_only = True

    def _raw_delete(self, using):
        self._apply_tenant_scope()
        return super()._raw_delete(using)

    def update(self, **kwargs):
        self._apply_tenant_scope()
        moved = {name for name in kwargs if name in self.model.tenant_placement_fields()}
        if moved and not self._tenant_columns_checked:
            raise TenantScopeError(
                f"update() cannot move {self.model._meta.label} rows to another "
                f"{'/'.join(sorted(moved))}: save() them, or bulk_update() (both check the parents)"
            )
        return super().update(**kwargs)

    update.alters_data = True

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        self.model.check_tenant_placement(objs)
        return super().bulk_create(objs, *args, **kwargs)

    bulk_create.alters_data = True

    def bulk_update(self, objs, fields, batch_size=None):
        objs = list(objs)
        placement = self.model.tenant_placement_fields()
        if any(self.model._meta.get_field(name).attname in placement or name in placement for name in fields):
            self.model.check_tenant_placement(objs)
            checked = self._chain()
            checked._tenant_columns_checked = True
            return super(TenantQuerySet, checked).bulk_update(objs, fields, batch_size=batch_size)
        return super().bulk_update(objs, fields, batch_size=batch_size)

    bulk_update.alters_data = True


class TenantManager(models.Manager.from_queryset(TenantQuerySet)):
    """The default manager of tenant-owned models: scoped, or pending a scope, never open."""

    def get_queryset(self):
        queryset = super().get_queryset()
        queryset._tenant_pending = True
        if scoping.active() is not None:
            queryset._apply_tenant_scope()
        return queryset


class TenantOwned(models.Model):
    """Mixin: rows that belong to one organization, read and written only within a scope.

    `tenant_field` is the column naming the organization (`id` for Organization itself).
    `tenant_parents` names the foreign keys, most specific first, whose row must agree with
    this one on every tenant column both carry (organization, cluster, node)."""

    tenant_field = "organization_id"
    tenant_parents: tuple[str, ...] = ()

    objects = TenantManager()

    class Meta:
        abstract = True

    # -- placement: the organization and the parents ------------------------------------------

    @classmethod
    def _tenant_columns(cls) -> tuple[str, ...]:
        names = {f.attname for f in cls._meta.concrete_fields}
        return tuple(c for c in TENANT_COLUMNS if c in names)

    @classmethod
    def _parent_specs(cls) -> list[tuple[models.ForeignKey, tuple[str, ...]]]:
        """(foreign key, tenant columns it must agree on) for each parent, most specific first."""
        cached = cls.__dict__.get("_tenant_specs")
        if cached is None:
            cached = cls._tenant_specs = cls._compute_parent_specs()
        return cached

    @classmethod
    def _compute_parent_specs(cls) -> list[tuple[models.ForeignKey, tuple[str, ...]]]:
        specs = []
        own = set(cls._tenant_columns())
        for name in cls.tenant_parents:
            field = cls._meta.get_field(name)
            parent_columns = {f.attname for f in field.related_model._meta.concrete_fields}
            shared = tuple(c for c in TENANT_COLUMNS if c in own and c in parent_columns and c != field.attname)
            specs.append((field, shared))
        return specs

    @classmethod
    def tenant_placement_fields(cls) -> set[str]:
        """Names (and attnames) of the columns that place a row: what update() may not change."""
        cached = cls.__dict__.get("_tenant_placement")
        if cached is None:
            cached = cls._tenant_placement = frozenset(cls._compute_placement_fields())
        return cached

    @classmethod
    def _compute_placement_fields(cls) -> set[str]:
        names = set(cls._tenant_columns())
        for field, _ in cls._parent_specs():
            names |= {field.name, field.attname}
        return names | {c.removesuffix("_id") for c in names}

    @classmethod
    def check_tenant_placement(cls, objs) -> None:
        """Every row agrees with its parents on the tenant columns both carry (empty ones are
        filled in from the parent), and its organization is writable in the active scope.

        One query per parent foreign key for all rows whose parent is not loaded already; a
        parent is not looked up when a more specific one already vouches for it (a NIC that
        agrees with its node agrees with the node's cluster)."""
        objs = list(objs)
        pending: dict[str, tuple[models.ForeignKey, tuple[str, ...], list]] = {}
        for obj in objs:
            verified: set[str] = set()
            for field, shared in cls._parent_specs():
                parent_id = getattr(obj, field.attname)
                if parent_id is None or not shared:
                    continue
                if field.attname in verified and set(shared) <= verified:
                    continue
                parent = field.get_cached_value(obj) if field.is_cached(obj) else None
                if parent is not None and parent.pk == parent_id:
                    cls._agree(obj, field, shared, {c: getattr(parent, c) for c in shared})
                else:
                    pending.setdefault(field.name, (field, shared, []))[2].append(obj)
                verified |= set(shared)
        for field, shared, rows in pending.values():
            ids = sorted({getattr(obj, field.attname) for obj in rows})
            found: dict = {}
            manager = field.related_model._base_manager
            for start in range(0, len(ids), _IN_CHUNK):
                for values in manager.filter(pk__in=ids[start:start + _IN_CHUNK]).values("pk", *shared):
                    found[values["pk"]] = values
            for obj in rows:
                values = found.get(getattr(obj, field.attname))
                if values is not None:  # a missing parent is the foreign key's error, not ours
                    cls._agree(obj, field, shared, values)
        for obj in objs:
            scoping.require_writable(getattr(obj, cls.tenant_field), f"writing {cls._meta.label}")

    @classmethod
    def _agree(cls, obj, field, shared, parent_values: dict) -> None:
        for column in shared:
            mine, theirs = getattr(obj, column), parent_values.get(column)
            if mine is None:
                setattr(obj, column, theirs)
            elif mine != theirs:
                raise TenantMismatch(
                    f"{cls._meta.label} {obj.pk or '(new)'}: {column}={mine} but its {field.name} "
                    f"{getattr(obj, field.attname)} has {column}={theirs}"
                )

    def _placement(self) -> tuple:
        return tuple(getattr(self, name) for name in (*self._tenant_columns(), *(f.attname for f, _ in
                                                                                  self._parent_specs())))

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._tenant_loaded = instance._placement() if len(values) == len(cls._meta.concrete_fields) else None
        return instance

    def save(self, *args, **kwargs):
        update_fields = kwargs.get("update_fields")
        placement = self.tenant_placement_fields()
        touches_placement = update_fields is None or any(name in placement for name in update_fields)
        unchanged = (self.pk is not None and getattr(self, "_tenant_loaded", None) is not None
                     and self._tenant_loaded == self._placement())
        if touches_placement and not unchanged:
            self.check_tenant_placement([self])
        else:
            scoping.require_writable(getattr(self, self.tenant_field), f"saving {self._meta.label}")
        super().save(*args, **kwargs)
        self._tenant_loaded = self._placement()

    def delete(self, *args, **kwargs):
        scoping.require_writable(getattr(self, self.tenant_field), f"deleting {self._meta.label}")
        return super().delete(*args, **kwargs)


class TimestampedModel(models.Model):
    created = models.DateTimeField(
        verbose_name="created",
        auto_now_add=True,
    )
    updated = models.DateTimeField(
        verbose_name="updated",
        auto_now=True,
    )

    class Meta:
        abstract = True


class OrganizationOwnedModel(TenantOwned, TimestampedModel):
    """A row that belongs to exactly one organization (the tenant)."""

    organization = models.ForeignKey(
        to="tenancy.Organization",
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="organization",
    )

    class Meta:
        abstract = True


class ClusterOwnedModel(OrganizationOwnedModel):
    """A row inside one cluster: its organization is the cluster's (filled in when left empty,
    checked always)."""

    cluster = models.ForeignKey(
        to="fleet.Cluster",
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name="cluster",
    )

    class Meta:
        abstract = True

    @classmethod
    def _compute_parent_specs(cls):
        specs = super()._compute_parent_specs()
        if "cluster" not in cls.tenant_parents:
            field = cls._meta.get_field("cluster")
            specs.append((field, ("organization_id",)))
        return specs


class Health(models.TextChoices):
    """Health of a fabric element as the live map colors it."""

    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    DOWN = "down", "Down"
    UNKNOWN = "unknown", "Unknown"
