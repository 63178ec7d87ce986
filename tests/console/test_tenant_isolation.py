"""Tenant isolation, tested from outside: every API route, three people, two organizations.

An outsider never reads, changes or hears another organization's data: its objects answer 404
on every route and method, lists never contain them, and the database is unchanged after the
attempt. A member reads; only the right role writes.
"""

from __future__ import annotations

import pytest

from console.commands.models import Command
from console.fleet.models import Cluster, EnrollmentToken, Node
from console.tenancy.models import ApiToken, Membership, Organization
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleets(world):
    acme = make_fleet(world.acme, "acme-cluster")
    globex = make_fleet(world.globex, "globex-cluster")
    world.alice_token = ApiToken.objects.get(pk=_token_id(world, "alice"))
    return {"acme": acme, "globex": globex}


def _token_id(world, name):
    plaintext = world.token(name)
    return ApiToken.lookup(plaintext).pk


def _targets(world, fleet):
    """Every detail route of an Acme object: (url, methods the owner may use)."""
    c, n = fleet.cluster.pk, fleet.node.pk
    return {
        f"/api/v1/organizations/{world.acme.pk}/": ["get", "patch"],
        f"/api/v1/members/{Membership.objects.get(user=world.users['bob']).pk}/": ["get", "patch", "delete"],
        f"/api/v1/tokens/{world.alice_token.pk}/": ["get", "delete"],
        f"/api/v1/clusters/{c}/": ["get", "patch", "put", "delete"],
        f"/api/v1/clusters/{c}/topology/": ["get", "put"],
        f"/api/v1/clusters/{c}/enrollment-tokens/": ["get", "post"],
        f"/api/v1/clusters/{c}/status/": ["get"],
        f"/api/v1/clusters/{c}/paths/?src={fleet.node.name}/nic0&dst={fleet.node.name[:-1]}1/nic0": ["get"],
        f"/api/v1/nodes/{n}/": ["get"],
        f"/api/v1/nodes/{n}/inventory/": ["get"],
        f"/api/v1/nodes/{n}/commands/": ["get", "post"],
        f"/api/v1/nodes/{n}/drain/": ["post"],
        f"/api/v1/nodes/{n}/undrain/": ["post"],
        f"/api/v1/nodes/{n}/retire/": ["post"],
        f"/api/v1/gpus/{fleet.gpu.pk}/": ["get"],
        f"/api/v1/nics/{fleet.nic.pk}/": ["get"],
        f"/api/v1/switches/{fleet.switch.pk}/": ["get"],
        f"/api/v1/links/{fleet.link.pk}/": ["get"],
        f"/api/v1/enrollment-tokens/{fleet.enrollment_token.pk}/": ["get", "delete"],
        f"/api/v1/commands/{fleet.command.pk}/": ["get"],
        f"/api/v1/commands/{fleet.command.pk}/cancel/": ["post"],
        f"/api/v1/telemetry/{fleet.record.pk}/": ["get"],
    }


BODIES = {"patch": {"name": "renamed"}, "put": {"name": "renamed"}, "post": {"type": "node.health"}}


def _snapshot():
    """Enough of the database to notice any change an outsider could make."""
    return (
        list(Organization.objects.values_list("id", "name").order_by("id")),
        list(Membership.objects.values_list("id", "role").order_by("id")),
        list(ApiToken.objects.values_list("id", "revoked_at").order_by("id")),
        list(Cluster.objects.values_list("id", "name", "topology_name").order_by("id")),
        list(Node.objects.values_list("id", "state").order_by("id")),
        list(EnrollmentToken.objects.values_list("id", "revoked_at").order_by("id")),
        list(Command.objects.values_list("id", "state").order_by("id")),
    )


def test_outsider_gets_404_on_every_route_and_method_and_changes_nothing(world, fleets):
    charlie = world.client("charlie")
    before = _snapshot()
    for url, methods in _targets(world, fleets["acme"]).items():
        for method in methods:
            response = getattr(charlie, method)(url, BODIES.get(method, {}), format="json")
            assert response.status_code == 404, (method, url, response.status_code, response.content[:200])
    assert _snapshot() == before


def test_outsider_with_a_session_gets_404_too(world, fleets):
    charlie = world.session("charlie")
    for url, methods in _targets(world, fleets["acme"]).items():
        if "get" in methods:
            assert charlie.get(url).status_code == 404, url


def test_member_can_read_every_object_of_the_organization(world, fleets):
    bob = world.client("bob", scope="read")
    for url, methods in _targets(world, fleets["acme"]).items():
        if url.startswith("/api/v1/tokens/") or "get" not in methods:
            continue  # members see only their own tokens (tested below)
        response = bob.get(url)
        assert response.status_code == 200, (url, response.status_code, response.content[:200])


def test_viewer_cannot_change_anything(world, fleets):
    bob = world.client("bob")  # a write-scoped token, but a viewer's role
    before = _snapshot()
    for url, methods in _targets(world, fleets["acme"]).items():
        if url.startswith("/api/v1/tokens/"):
            continue
        for method in methods:
            if method == "get":
                continue
            response = getattr(bob, method)(url, BODIES.get(method, {}), format="json")
            assert response.status_code == 403, (method, url, response.status_code, response.content[:200])
    assert _snapshot() == before


LISTS = ["organizations", "members", "tokens", "clusters", "nodes", "gpus", "nics", "switches", "links",
         "enrollment-tokens", "commands", "telemetry"]


@pytest.mark.parametrize("resource", LISTS)
def test_lists_hold_only_the_callers_organizations(world, fleets, resource):
    for name, own, other in (("alice", world.acme, world.globex), ("charlie", world.globex, world.acme)):
        response = world.client(name).get(f"/api/v1/{resource}/", {"limit": 1000})
        assert response.status_code == 200
        rows = response.json()["results"]
        assert rows, f"{name} should see their own {resource}"
        org_ids = {row["id"] if resource == "organizations" else row["organization"] for row in rows}
        assert org_ids == {own.pk}, (resource, name, org_ids)
        assert other.pk not in org_ids


def test_anonymous_requests_are_refused_everywhere(world, fleets):
    anonymous = world.client(None)
    for url, methods in [(f"/api/v1/{r}/", ["get"]) for r in LISTS] + list(_targets(world, fleets["acme"]).items()):
        for method in methods:
            assert getattr(anonymous, method)(url).status_code == 401, (method, url)


def test_a_foreign_node_cannot_be_named_in_a_command(world, fleets):
    response = world.client("charlie").post(
        "/api/v1/commands/", {"node": fleets["acme"].node.pk, "type": "node.health"}, format="json"
    )
    assert response.status_code == 400
    assert "node" in response.json()["fields"]
    assert not Command.objects.filter(node=fleets["acme"].node, created_by=world.users["charlie"]).exists()


def test_a_cluster_cannot_be_created_in_a_foreign_organization(world, fleets):
    response = world.client("charlie").post(
        "/api/v1/clusters/", {"name": "intrusion", "organization": world.acme.pk}, format="json"
    )
    assert response.status_code == 400
    assert not Cluster.objects.filter(name="intrusion").exists()


def test_members_see_only_their_own_tokens_and_owners_see_all(world, fleets):
    world.token("bob")
    bob_rows = world.client("bob").get("/api/v1/tokens/").json()["results"]
    assert {row["user"] for row in bob_rows} == {"bob"}
    alice_rows = world.client("alice").get("/api/v1/tokens/").json()["results"]
    assert {"alice", "bob"} <= {row["user"] for row in alice_rows}
