"""The browser console's pages through Django's test client: owner, viewer, operator, outsider.

An outsider gets 404 for every page of another organization's objects; a viewer sees pages but
no write forms, and a forged POST from a viewer answers 403 and changes nothing.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client

from console.fleet.models import Cluster, EnrollmentToken, Link, Node, NodeState
from console.fleet.services import mark_seen
from console.tenancy.models import Membership, Role
from console.tenancy.scope import SESSION_ORGANIZATION_KEY
from console.web import maps
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


def page(world, name: str | None) -> Client:
    client = Client()
    if name:
        client.force_login(world.users[name])
    return client


@pytest.fixture
def fleets(world):
    return {"acme": make_fleet(world.acme, "acme-cluster"), "globex": make_fleet(world.globex, "globex-cluster")}


def cluster_urls(fleet) -> list[str]:
    c = fleet.cluster.pk
    return [f"/clusters/{c}/", f"/clusters/{c}/status.json"]


# --- signing in ---------------------------------------------------------------------------------


def test_pages_need_a_signed_in_user(world, fleets):
    anonymous = page(world, None)
    for url in ["/", "/clusters/", *cluster_urls(fleets["acme"])]:
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url
    assert anonymous.get("/login/").status_code == 200


def test_login_form_signs_in_and_logout_signs_out(world):
    client = Client()
    form = client.get("/login/").content.decode()
    assert 'for="id_username"' in form and 'for="id_password"' in form
    bad = client.post("/login/", {"username": "alice", "password": "wrong"})
    assert bad.status_code == 200 and "did not match" in bad.content.decode()
    good = client.post("/login/", {"username": "alice", "password": "pw-alice"})
    assert good.status_code == 302 and good["Location"] == "/clusters/"
    assert client.get("/clusters/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/clusters/").status_code == 302


# --- clusters list and the organization switcher -----------------------------------------------


def test_clusters_lists_the_active_organization_with_node_counts(world, fleets):
    Node.objects.create(organization=world.acme, cluster=fleets["acme"].cluster, name="extra", state=NodeState.LOST)
    html = page(world, "bob").get("/clusters/").content.decode()
    assert "acme-cluster" in html and "globex-cluster" not in html
    row = re.search(rf'<tr data-cluster="{fleets["acme"].cluster.pk}">(.*?)</tr>', html, re.S).group(1)
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', row))
    expected = {"total": Node.objects.filter(cluster=fleets["acme"].cluster).count()}
    for state in ("ready", "enrolling", "lost", "draining", "retired"):
        expected[state] = Node.objects.filter(cluster=fleets["acme"].cluster, state=state).count()
    assert {k: int(v) for k, v in counts.items()} == expected
    assert expected["lost"] == 1 and expected["total"] == 3


@pytest.mark.parametrize(("name", "sees_form"), [("alice", True), ("carol", True), ("bob", False)])
def test_only_operators_and_owners_see_the_create_cluster_form(world, name, sees_form):
    assert ('id="create-cluster"' in page(world, name).get("/clusters/").content.decode()) is sees_form


def test_an_operator_creates_a_cluster_in_the_active_organization(world):
    response = page(world, "carol").post("/clusters/", {"name": "new-one"})
    cluster = Cluster.objects.get(name="new-one")
    assert cluster.organization == world.acme
    assert response.status_code == 302 and response["Location"] == f"/clusters/{cluster.pk}/"
    again = page(world, "carol").post("/clusters/", {"name": "new-one"}, follow=True)
    assert "already exists" in again.content.decode() and Cluster.objects.filter(name="new-one").count() == 1


def test_a_viewers_forged_create_cluster_post_is_refused(world):
    response = page(world, "bob").post("/clusters/", {"name": "forged"})
    assert response.status_code == 403
    assert not Cluster.objects.filter(name="forged").exists()


def test_a_post_without_the_csrf_token_is_refused(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["alice"])
    assert client.post("/clusters/", {"name": "no-csrf"}).status_code == 403
    assert not Cluster.objects.filter(name="no-csrf").exists()


def test_the_switcher_changes_the_active_organization_for_the_session(world, fleets):
    Membership.objects.create(organization=world.globex, user=world.users["bob"], role=Role.OPERATOR)
    bob = page(world, "bob")
    html = bob.get("/clusters/").content.decode()
    assert "Clusters of Acme" in html and 'id="org-select"' in html and "Globex" in html
    response = bob.post("/organizations/switch/", {"organization": world.globex.pk})
    assert response.status_code == 302 and bob.session[SESSION_ORGANIZATION_KEY] == world.globex.pk
    html = bob.get("/clusters/").content.decode()
    assert "Clusters of Globex" in html and "globex-cluster" in html and "acme-cluster" not in html
    assert 'id="create-cluster"' in html  # bob is an operator in Globex, a viewer in Acme
    bob.post("/clusters/", {"name": "made-in-globex"})
    assert Cluster.objects.get(name="made-in-globex").organization == world.globex
    # Another browser of the same user keeps its own active organization.
    assert "Clusters of Acme" in page(world, "bob").get("/clusters/").content.decode()


def test_switching_to_a_foreign_or_bogus_organization_is_404(world):
    alice = page(world, "alice")
    for value in (world.globex.pk, "", "x", 999999):
        assert alice.post("/organizations/switch/", {"organization": value}).status_code == 404
    assert SESSION_ORGANIZATION_KEY not in alice.session
    assert "Clusters of Acme" in alice.get("/clusters/").content.decode()


# --- the cluster page --------------------------------------------------------------------------


def test_the_cluster_page_shows_nodes_and_the_map_colored_by_health(world, fleets):
    fleet = fleets["acme"]
    mark_seen(fleet.node)  # first contact: ready
    Node.objects.filter(pk=fleet.node.pk).update(agent_version="0.3.1")
    Link.objects.filter(pk=fleet.link.pk).update(health="down")
    html = page(world, "bob").get(f"/clusters/{fleet.cluster.pk}/").content.decode()
    assert '<svg id="fabric-map"' in html and 'data-aggregated="false"' in html
    # Every declared element is drawn once, with a title, colored from the database.
    for kind, count in (("node", 2), ("switch", 2), ("nic", 2), ("link", 3)):
        assert len(re.findall(rf'data-kind="{kind}"', html)) == count, kind
    assert re.search(r'class="link health-down" data-kind="link" data-name="leaf-0~spine-0#0"', html)
    assert re.search(r'class="host health-ok" data-kind="node" data-name="acme-node0"', html)  # enrolled, seen
    assert re.search(r'class="host health-unknown" data-kind="node" data-name="acme-node1"', html)  # enrolling
    assert "<title>leaf-0 (leaf)</title>" in html
    # The nodes table: state, last seen, agent version, GPUs.
    row = re.search(rf'<tr data-node="{fleet.node.pk}".*?</tr>', html, re.S).group(0)
    assert 'data-field="state">ready<' in row and "<time datetime=" in row
    assert "<td>0.3.1</td>" in row and "<td>1</td>" in row  # agent version, GPUs
    assert 'id="initial-status"' in html and f'data-status-url="/clusters/{fleet.cluster.pk}/status.json"' in html
    assert f'"o{world.acme.pk}.c{fleet.cluster.pk}"' in html  # the live group it subscribes to


def test_a_cluster_without_topology_says_how_to_import_one(world):
    cluster = Cluster.objects.create(organization=world.acme, name="empty")
    html = page(world, "alice").get(f"/clusters/{cluster.pk}/").content.decode()
    assert "No topology yet" in html and "fabric-map" not in html


@pytest.mark.parametrize(("name", "can_write"), [("alice", True), ("carol", True), ("bob", False)])
def test_write_controls_follow_the_role(world, fleets, name, can_write):
    html = page(world, name).get(f"/clusters/{fleets['acme'].cluster.pk}/").content.decode()
    assert ('id="enrollment-form"' in html) is can_write
    assert (">Revoke<" in html) is can_write
    assert fleets["acme"].enrollment_token.prefix_display in html  # everyone sees the list


def test_an_outsider_gets_404_for_every_page_of_another_organization(world, fleets):
    acme = fleets["acme"]
    charlie = page(world, "charlie")
    for url in cluster_urls(acme):
        assert charlie.get(url).status_code == 404, url
    revoke = f"/clusters/{acme.cluster.pk}/enrollment-tokens/{acme.enrollment_token.pk}/revoke/"
    assert charlie.post(revoke).status_code == 404
    assert charlie.post(f"/clusters/{acme.cluster.pk}/", {"expires_hours": "1"}).status_code == 404
    # Charlie's own cluster's URL with Acme's token: still 404, and nothing changed.
    own = f"/clusters/{fleets['globex'].cluster.pk}/enrollment-tokens/{acme.enrollment_token.pk}/revoke/"
    assert charlie.post(own).status_code == 404
    assert EnrollmentToken.objects.filter(cluster=acme.cluster).count() == 1
    assert not EnrollmentToken.objects.get(pk=acme.enrollment_token.pk).is_revoked
    assert charlie.get("/clusters/999999/").status_code == 404


def test_status_json_is_the_maps_health(world, fleets):
    fleet = fleets["acme"]
    mark_seen(fleet.node)
    status = page(world, "bob").get(f"/clusters/{fleet.cluster.pk}/status.json").json()
    assert status["aggregated"] is False
    assert {n["name"]: n["state"] for n in status["nodes"]} == {"acme-node0": "ready", "acme-node1": "enrolling"}
    assert {s["name"] for s in status["switches"]} == {"leaf-0", "spine-0"}
    assert len(status["links"]) == 3 and len(status["nics"]) == 2


# --- enrollment tokens -------------------------------------------------------------------------


def test_an_operator_creates_an_enrollment_token_and_sees_the_install_command_once(world, fleets):
    cluster = fleets["acme"].cluster
    carol = page(world, "carol")
    response = carol.post(f"/clusters/{cluster.pk}/", {"description": "rack 4", "expires_hours": "2", "max_uses": "3"})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    html = response.content.decode()
    command = re.search(r'<pre id="install-command">(.*?)</pre>', html).group(1)
    unattended = re.search(r'<pre id="install-command-token-file">(.*?)</pre>', html).group(1)
    # The token is shown beside the lines, never in them (a command line is readable by every user).
    assert command == "curl -fsSL http://testserver/install.sh | sudo sh"
    assert unattended == "curl -fsSL http://testserver/install.sh | sudo sh -s -- --token-file /root/lockstep.token"
    match = re.fullmatch(r"(lse_\S+)", re.search(r'<pre id="enrollment-token">(.*?)</pre>', html).group(1))
    assert match
    token = EnrollmentToken.lookup(match.group(1))
    assert token is not None and token.cluster == cluster and token.max_uses == 3 and token.description == "rack 4"
    assert token.created_by == world.users["carol"] and match.group(1) not in (token.digest, token.key)
    assert 1.9 * 3600 < (token.expires - token.created).total_seconds() <= 2 * 3600 + 5
    row = re.search(rf'<tr data-token="{token.pk}">.*?</tr>', html, re.S).group(0)
    assert token.prefix_display in row and "0/3" in row and "active" in row
    # Shown once: the page afterwards lists the token but never its secret.
    later = carol.get(f"/clusters/{cluster.pk}/").content.decode()
    assert token.prefix_display in later and match.group(1) not in later and "install-command" not in later


def test_the_page_and_the_api_give_enrollment_tokens_the_same_default_lifetime(world, fleets):
    from console.fleet.services import ENROLLMENT_TOKEN_TTL

    cluster = fleets["acme"].cluster
    form = page(world, "carol").get(f"/clusters/{cluster.pk}/").content.decode()
    default_hours = re.search(r'name="expires_hours"[^>]*value="(\d+)"', form).group(1)
    assert int(default_hours) * 3600 == ENROLLMENT_TOKEN_TTL.total_seconds()
    by_page = page(world, "carol").post(f"/clusters/{cluster.pk}/", {"expires_hours": default_hours})
    by_api = world.client("carol").post(f"/api/v1/clusters/{cluster.pk}/enrollment-tokens/", {}, format="json")
    assert by_page.status_code == 201 and by_api.status_code == 201
    for token in EnrollmentToken.objects.filter(cluster=cluster).order_by("-pk")[:2]:
        assert abs((token.expires - token.created) - ENROLLMENT_TOKEN_TTL).total_seconds() < 60


def test_bad_token_parameters_create_nothing(world, fleets):
    cluster = fleets["acme"].cluster
    before = EnrollmentToken.objects.count()
    for data in ({"expires_hours": "0"}, {"expires_hours": "x"}, {"expires_hours": "1", "max_uses": "0"}):
        response = page(world, "alice").post(f"/clusters/{cluster.pk}/", data)
        html = response.content.decode()
        assert response.status_code == 200 and "install-command" not in html
        assert 'class="message error"' in html
    assert EnrollmentToken.objects.count() == before


def test_a_viewers_forged_token_posts_are_refused(world, fleets):
    fleet = fleets["acme"]
    bob = page(world, "bob")
    assert bob.post(f"/clusters/{fleet.cluster.pk}/", {"expires_hours": "1"}).status_code == 403
    revoke = f"/clusters/{fleet.cluster.pk}/enrollment-tokens/{fleet.enrollment_token.pk}/revoke/"
    assert bob.post(revoke).status_code == 403
    assert EnrollmentToken.objects.filter(cluster=fleet.cluster).count() == 1
    assert not EnrollmentToken.objects.get(pk=fleet.enrollment_token.pk).is_revoked


def test_an_operator_revokes_a_token(world, fleets):
    fleet = fleets["acme"]
    revoke = f"/clusters/{fleet.cluster.pk}/enrollment-tokens/{fleet.enrollment_token.pk}/revoke/"
    assert page(world, "carol").get(revoke).status_code == 405
    html = page(world, "carol").post(revoke, follow=True).content.decode()
    assert EnrollmentToken.objects.get(pk=fleet.enrollment_token.pk).is_revoked
    row = re.search(rf'<tr data-token="{fleet.enrollment_token.pk}">.*?</tr>', html, re.S).group(0)
    assert "revoked" in row and ">Revoke<" not in row


# --- large fabrics -----------------------------------------------------------------------------


def test_a_fabric_above_the_threshold_is_drawn_aggregated(world, fleets, monkeypatch):
    """Forced with a low threshold on the small fabric: groups with cells, bundles for cables."""
    from workers.fabric import layout

    monkeypatch.setattr(layout, "FULL_MAX_LINKS", 2)
    fleet = fleets["acme"]
    Link.objects.filter(pk=fleet.link.pk).update(health="down")
    maps._cache.clear()
    html = page(world, "bob").get(f"/clusters/{fleet.cluster.pk}/").content.decode()
    maps._cache.clear()
    assert 'data-aggregated="true"' in html and 'data-kind="link"' not in html and 'data-kind="nic"' not in html
    assert len(re.findall(r'class="cell host', html)) == 2 and len(re.findall(r'class="cell switch', html)) == 2
    bundles = re.findall(r'<path class="bundle health-(\w+)" data-kind="bundle" data-name="(B\d+)"', html)
    assert len(bundles) == 2  # hosts-leaf (2 cables), leaf-spine (1 cable, down)
    status = page(world, "bob").get(f"/clusters/{fleet.cluster.pk}/status.json").json()
    maps._cache.clear()
    assert status["aggregated"] is True and "links" not in status and "nics" not in status
    by_name = {b["name"]: b for b in status["bundles"]}
    assert {b["health"] for b in by_name.values()} == {"down", "unknown"}
    down = next(b for b in by_name.values() if b["health"] == "down")
    assert down["bad"] == ["leaf-0~spine-0#0"] and down["counts"] == {"down": 1}
    assert dict(bundles)["down"] == down["name"]  # the page drew it with the same health


@pytest.mark.slow
def test_the_9216_gpu_fabric_page_stays_small(world):
    """The real large fabric (23,616 cables): an aggregated page of bounded size, and a
    status JSON summarized per bundle instead of 33k rows."""
    from console.fleet.services import import_topology
    from testbed.simulate.topology import PRESETS, generate_topology

    cluster = Cluster.objects.create(organization=world.acme, name="big")
    import_topology(cluster, generate_topology(PRESETS["gpu9216"][0]))
    client = page(world, "bob")
    html = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert 'data-aggregated="true"' in html
    drawn = len(re.findall(r'data-kind="', html))
    assert drawn == 1152 + 720 + len(re.findall(r'data-kind="(?:bundle|group)"', html))
    assert len(re.findall(r'data-kind="bundle"', html)) < 200
    assert len(html) < 1_500_000
    status = client.get(f"/clusters/{cluster.pk}/status.json")
    assert len(status.content) < 300_000 and "links" not in status.json()
