"""Tenant scoping fails closed: no scope, no rows; a scope, only its organizations' rows.

The default manager of every tenant-owned model refuses to query with no scope active, and
filters by the active one; writes outside it are refused; a child row must agree with its
parents on organization, cluster and node. Every entry point starts closed.
"""

from __future__ import annotations

import asyncio

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.http import JsonResponse
from django.test import Client, RequestFactory
from django.urls import path

from api.agent.views import agent_endpoint
from console.celery import app as celery_app
from console.core import scoping
from console.core.models import TenantOwned
from console.core.scoping import TenantMismatch, TenantScopeError
from console.fleet.models import Cluster, Nic, Node, Switch
from console.tenancy.models import Organization
from tests.conftest import needs_postgres
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleets(world):
    return {"acme": make_fleet(world.acme, "acme-cluster"), "globex": make_fleet(world.globex, "globex-cluster")}


def tenant_models():
    return [m for m in apps.get_models() if issubclass(m, TenantOwned)]


# --- reading ------------------------------------------------------------------------------------


def test_every_domain_model_is_tenant_owned():
    owned = {m._meta.label for m in tenant_models()}
    domain = {m._meta.label for m in apps.get_models()
              if m._meta.app_label in ("tenancy", "fleet", "commands", "telemetry", "audits", "clocks", "incidents",
                                       "jobs")}
    assert domain == owned


@pytest.mark.parametrize("model", tenant_models(), ids=lambda m: m._meta.label)
def test_a_query_with_no_scope_is_refused_naming_the_model(fleets, model):
    with scoping.closed():
        with pytest.raises(TenantScopeError, match=model._meta.label):
            list(model.objects.all())
        for run in (lambda qs: qs.count(), lambda qs: qs.exists(), lambda qs: qs.first(),
                    lambda qs: list(qs.iterator()), lambda qs: qs.values_list("pk").first(),
                    lambda qs: qs.update(created=qs.model._meta.get_field("created").default),
                    lambda qs: qs.delete()):
            with pytest.raises(TenantScopeError):
                run(model.objects.all())
        assert list(model.objects.none()) == []  # nothing to hide: no query runs


def test_a_scope_sees_only_its_organizations(world, fleets):
    with scoping.for_organization(world.acme.pk):
        assert set(Cluster.objects.values_list("name", flat=True)) == {"acme-cluster"}
        assert list(Organization.objects.values_list("slug", flat=True)) == ["acme"]
        assert Node.objects.filter(pk=fleets["globex"].node.pk).first() is None
        # reverse relations are scoped too: another tenant's row, however reached, shows nothing
        assert fleets["globex"].node.nics.count() == 0 and fleets["acme"].node.nics.count() == 1
    with scoping.for_organizations([]):
        assert Cluster.objects.count() == 0
    with scoping.unscoped("the test compares both tenants"):
        assert Cluster.objects.count() == 2


def test_unscoped_needs_a_reason():
    with pytest.raises(ValueError, match="reason"):
        scoping.unscoped("  ")


def test_a_queryset_made_outside_any_scope_takes_the_scope_it_runs_in_and_is_not_changed_by_it(world, fleets):
    with scoping.closed():
        shared = Cluster.objects.all()  # like a filter's or a serializer field's class-level queryset
    with scoping.for_organization(world.acme.pk):
        assert [c.name for c in shared.all()] == ["acme-cluster"]
    with scoping.for_organization(world.globex.pk):
        assert [c.name for c in shared.all()] == ["globex-cluster"]  # acme's scope did not stick to it
    with scoping.closed(), pytest.raises(TenantScopeError):
        list(shared.all())


def test_a_subquery_and_a_combination_are_scoped_as_a_whole(world, fleets):
    with scoping.closed():
        pending = Cluster.objects.all()
    with scoping.for_organization(world.acme.pk):
        assert set(Node.objects.filter(cluster__in=pending).values_list("organization_id", flat=True)) == {world.acme.pk}
        either = Cluster.objects.filter(name="acme-cluster") | pending.filter(name="globex-cluster")
        assert [c.name for c in either] == ["acme-cluster"]


def test_an_asyncio_task_and_a_thread_of_asgiref_inherit_the_scope(world, fleets):
    from asgiref.sync import sync_to_async

    async def scope_in_a_thread():
        task = asyncio.ensure_future(sync_to_async(scoping.active, thread_sensitive=False)())
        return await task

    with scoping.for_organization(world.acme.pk):
        assert asyncio.run(scope_in_a_thread()).organization_ids == {world.acme.pk}
    assert scoping.active().is_unscoped  # and nothing leaked back


# --- writing ------------------------------------------------------------------------------------


def test_writing_outside_the_scope_is_refused(world, fleets):
    with scoping.for_organization(world.acme.pk):
        with pytest.raises(TenantScopeError, match="outside the active scope"):
            Cluster.objects.create(organization=world.globex, name="intruder")
        with pytest.raises(TenantScopeError):
            Switch.objects.bulk_create([Switch(cluster=fleets["globex"].cluster, name="s")])
        with pytest.raises(TenantScopeError):
            fleets["globex"].switch.delete()
    with scoping.closed(), pytest.raises(TenantScopeError, match="no tenant scope"):
        fleets["acme"].switch.save()
    assert not Cluster.objects.filter(name="intruder").exists()


def test_a_child_takes_its_parents_organization_when_none_is_given(world, fleets):
    cluster = fleets["acme"].cluster
    with scoping.for_organization(world.acme.pk):
        switch = Switch.objects.create(cluster=cluster, name="leaf-new")
        nic = Nic.objects.create(node=fleets["acme"].node, name="acme-node0/nic9", device="nic9")
    assert switch.organization_id == world.acme.pk
    assert (nic.organization_id, nic.cluster_id) == (world.acme.pk, cluster.pk)


def test_a_child_that_names_another_organization_than_its_parent_is_refused_on_save(world, fleets):
    acme, globex = fleets["acme"], fleets["globex"]
    with pytest.raises(TenantMismatch, match="organization_id"):
        Node.objects.create(organization=world.acme, cluster=globex.cluster, name="cross")
    with pytest.raises(TenantMismatch, match="its node"):
        Nic.objects.create(organization=world.acme, cluster=acme.cluster, node=globex.node, name="x/nic0")
    nic = Nic.objects.get(pk=acme.nic.pk)
    nic.node_id = globex.node.pk
    with pytest.raises(TenantMismatch):
        nic.save()
    with pytest.raises(TenantMismatch):  # in bulk too, with one query per parent
        Nic.objects.bulk_create([Nic(organization=world.acme, cluster=acme.cluster, node_id=globex.node.pk,
                                     name="bulk/nic0")])
    with pytest.raises(TenantMismatch):
        gpu = acme.gpu
        gpu.nearest_nic_id = globex.nic.pk
        gpu.save()
    assert not Node.objects.filter(name="cross").exists() and not Nic.objects.filter(name="bulk/nic0").exists()


def test_update_cannot_move_rows_to_another_organization(world, fleets):
    with pytest.raises(TenantScopeError, match="cannot move"):
        Node.objects.filter(pk=fleets["acme"].node.pk).update(organization=world.globex)
    assert Node.objects.get(pk=fleets["acme"].node.pk).organization_id == world.acme.pk


@needs_postgres
def test_postgresql_refuses_a_child_placed_outside_its_parent_even_past_the_orm(world, fleets):
    node = fleets["acme"].node
    with pytest.raises(IntegrityError, match="placement"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("UPDATE fleet_node SET organization_id = %s WHERE id = %s", [world.globex.pk, node.pk])
    with pytest.raises(IntegrityError, match="placement"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("UPDATE fleet_nic SET node_id = %s WHERE id = %s", [fleets["globex"].node.pk,
                                                                             fleets["acme"].nic.pk])


# --- every entry point starts closed -------------------------------------------------------------


def leaky_view(request):
    """A view that forgot to enter a scope."""
    return JsonResponse({"clusters": Cluster.objects.count()})


urlpatterns = [path("leaky/", leaky_view)]


@pytest.mark.urls("tests.console.test_scoping")
def test_a_page_that_forgets_its_scope_fails_even_when_its_caller_was_unscoped(fleets):
    # The test body is unscoped (tests/conftest.py); the request must not inherit it.
    with pytest.raises(TenantScopeError):
        Client().get("/leaky/")


def test_an_agent_endpoint_starts_closed(fleets):
    @agent_endpoint("GET")
    async def leaky_agent_view(request):
        return JsonResponse({"nodes": Node.objects.count()})

    with pytest.raises(TenantScopeError):
        asyncio.run(leaky_agent_view(RequestFactory().get("/api/v1/agent/leaky")))


def test_a_celery_task_starts_closed_and_runs_when_it_says_its_scope(world, fleets):
    @celery_app.task(name="tests.count_clusters")
    def count_clusters(organization_id=None):
        if organization_id is None:
            return Cluster.objects.count()
        with scoping.for_organization(organization_id):
            return Cluster.objects.count()

    with pytest.raises(TenantScopeError):
        count_clusters.apply(throw=True)
    assert count_clusters.apply(kwargs={"organization_id": world.acme.pk}).get() == 1
