"""Enrollment through the real agent endpoint, and every way it is refused."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.fleet.models import Cluster, EnrollmentToken, Node, NodeCredential, NodeState
from console.fleet.services import import_topology
from tests.factories import make_enrollment_token, small_topology

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(world):
    cluster = Cluster.objects.create(organization=world.acme, name="a")
    import_topology(cluster, small_topology("node"))
    return cluster


def _enroll(token, hostname="node0", machine_id="m-0", proof=None, **extra):
    body = {"token": token, "host": {"hostname": hostname, "machine_id": machine_id, "agent_version": "0.1.0"}, **extra}
    headers = {"HTTP_AUTHORIZATION": f"Bearer {proof}"} if proof else {}
    return Client(**headers).post("/api/v1/agent/enroll", body, content_type="application/json")


class _Agent:
    def __init__(self, credential):
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {credential}")

    def post(self, path, data=None, **kwargs):
        return self.client.post(path, data if data is not None else {}, content_type="application/json")


def _agent(credential) -> _Agent:
    return _Agent(credential)


def test_enrollment_binds_the_agent_to_its_declared_host_and_it_becomes_ready(cluster):
    token = make_enrollment_token(cluster, max_uses=2)
    response = _enroll(token, cluster_id=cluster.pk)
    assert response.status_code == 201, response.content
    body = response.json()
    node = Node.objects.get(pk=body["node_id"])
    assert node.name == "node0" and node.in_topology and node.state == NodeState.ENROLLING
    assert body["credential"].startswith("lsn_") and body["cluster_id"] == cluster.pk
    beat = _agent(body["credential"]).post("/api/v1/agent/heartbeat", {"uptime_s": 3.5})
    assert beat.status_code == 200 and beat.json()["node_state"] == "ready"
    node.refresh_from_db()
    assert node.state == NodeState.READY and node.last_seen is not None and node.agent_status == {"uptime_s": 3.5}
    assert EnrollmentToken.objects.get().uses == 1


def test_an_unknown_host_becomes_a_new_node(cluster):
    response = _enroll(make_enrollment_token(cluster), hostname="gpu-spare-7", machine_id="m-7")
    assert response.status_code == 201
    assert Node.objects.get(name="gpu-spare-7").in_topology is False


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"expires": timezone.now() - timedelta(minutes=1)}, "enrollment_token_expired"),
        ({"revoked_at": timezone.now()}, "enrollment_token_revoked"),
        ({"max_uses": 1, "uses": 1}, "enrollment_token_exhausted"),
    ],
)
def test_expired_revoked_and_exhausted_tokens_are_refused_and_nothing_changes(cluster, fields, code):
    token = make_enrollment_token(cluster, **fields)
    nodes_before = list(Node.objects.values_list("id", "state", "machine_id"))
    response = _enroll(token)
    assert response.status_code == 401
    assert response.json()["error"] == code
    assert list(Node.objects.values_list("id", "state", "machine_id")) == nodes_before
    assert not NodeCredential.objects.exists()


def test_a_token_of_another_cluster_is_refused(world, cluster):
    other = Cluster.objects.create(organization=world.acme, name="b")
    response = _enroll(make_enrollment_token(other), cluster_id=cluster.pk)
    assert response.status_code == 403
    assert response.json()["error"] == "enrollment_token_wrong_cluster"
    assert not NodeCredential.objects.exists()


def test_a_token_of_another_organizations_cluster_is_refused(world, cluster):
    foreign = Cluster.objects.create(organization=world.globex, name="g")
    response = _enroll(make_enrollment_token(foreign), cluster_id=cluster.pk)
    assert response.status_code == 403
    assert Node.objects.filter(cluster=foreign).count() == 0


def test_unknown_and_malformed_tokens_are_refused(cluster):
    for token in ["lse_AAAAAAAAAAAA.bogus", "garbage", "", None]:
        response = _enroll(token)
        assert response.status_code == 401, token
        assert response.json()["error"] == "enrollment_token_invalid"


def test_missing_host_facts_are_named(cluster):
    response = Client().post("/api/v1/agent/enroll", {"token": make_enrollment_token(cluster), "host": {"hostname": "x"}},
                             content_type="application/json")
    assert response.status_code == 400
    assert response.json()["fields"] == {"host.machine_id": response.json()["detail"]}


def test_a_second_machine_claiming_an_enrolled_hostname_is_a_conflict(cluster):
    token = make_enrollment_token(cluster)
    assert _enroll(token, machine_id="m-original").status_code == 201
    response = _enroll(token, machine_id="m-clone")
    assert response.status_code == 409
    assert response.json()["error"] == "hostname_taken"
    assert "machine-id" in response.json()["detail"]


def test_re_enrolling_the_same_machine_keeps_the_node_and_replaces_the_credential(cluster):
    token = make_enrollment_token(cluster)
    first = _enroll(token).json()
    second = _enroll(token, proof=first["credential"]).json()  # the agent proves it holds the credential
    assert first["node_id"] == second["node_id"]
    assert _agent(first["credential"]).post("/api/v1/agent/heartbeat").status_code == 401
    assert _agent(second["credential"]).post("/api/v1/agent/heartbeat").status_code == 200


def test_a_retired_node_is_told_so(cluster):
    body = _enroll(make_enrollment_token(cluster)).json()
    node = Node.objects.get(pk=body["node_id"])
    Node.objects.filter(pk=node.pk).update(state=NodeState.RETIRED)
    response = _agent(body["credential"]).post("/api/v1/agent/heartbeat")
    assert response.status_code == 403 and response.json()["error"] == "node_retired"


def test_the_api_creates_an_enrollment_token_with_the_install_command(world, cluster):
    response = world.client("carol").post(f"/api/v1/clusters/{cluster.pk}/enrollment-tokens/",
                                          {"description": "rack 4", "max_uses": 16}, format="json")
    assert response.status_code == 201
    body = response.json()
    # The token is in neither line: a command line is readable by every user of the node.
    assert body["install_command"] == "curl -fsSL http://testserver/install.sh | sudo sh"
    assert body["install_command_token_file"] == (
        "curl -fsSL http://testserver/install.sh | sudo sh -s -- --token-file /root/lockstep.token")
    assert body["max_uses"] == 16 and body["expires"] is not None
    assert _enroll(body["token"]).status_code == 201


# --- issue 9, finding 1: a token alone never takes over an enrolled node ---------------------------

def test_a_token_and_a_known_machine_id_do_not_take_over_an_enrolled_node(world, cluster):
    token = make_enrollment_token(cluster)
    real = _enroll(token, machine_id="m-real").json()
    # The impostor knows the machine id (viewers see it in /api/v1/nodes/) and holds a token.
    seen = world.client("bob").get(f"/api/v1/nodes/{real['node_id']}/").json()
    impostor = _enroll(token, hostname=seen["name"], machine_id="m-real")
    assert impostor.status_code == 409, impostor.content
    assert impostor.json()["error"] == "node_already_enrolled"
    assert "reset-credential" in impostor.json()["detail"]
    # The real node keeps working; no credential was issued to the impostor.
    assert _agent(real["credential"]).post("/api/v1/agent/heartbeat").status_code == 200
    assert NodeCredential.objects.filter(node_id=real["node_id"]).count() == 1
    # A credential that is not the node's is no proof either.
    other = _enroll(token, hostname="gpu-spare-1", machine_id="m-other").json()
    assert _enroll(token, machine_id="m-real", proof=other["credential"]).status_code == 409


def test_after_an_operator_resets_the_node_a_token_enrolls_it_again(world, cluster):
    token = make_enrollment_token(cluster)
    real = _enroll(token, machine_id="m-real").json()
    url = f"/api/v1/nodes/{real['node_id']}/reset-credential/"
    assert world.client("bob").post(url).status_code == 403  # a viewer may not
    assert world.client("charlie").post(url).status_code == 404  # another organization's node
    assert _agent(real["credential"]).post("/api/v1/agent/heartbeat").status_code == 200
    assert world.client("carol").post(url).status_code == 200
    assert _agent(real["credential"]).post("/api/v1/agent/heartbeat").status_code == 401  # that agent stops
    again = _enroll(token, machine_id="m-real")
    assert again.status_code == 201 and again.json()["node_id"] == real["node_id"]


def test_token_defaults_are_bounded_and_the_same_in_the_api_the_page_and_the_cli(world, cluster, capsys):
    from django.core.management import call_command

    from console.fleet.services import ENROLLMENT_TOKEN_MAX_USES, ENROLLMENT_TOKEN_TTL

    assert ENROLLMENT_TOKEN_MAX_USES is not None and ENROLLMENT_TOKEN_MAX_USES <= 10
    assert timedelta(hours=1) >= ENROLLMENT_TOKEN_TTL
    api = world.client("carol").post(f"/api/v1/clusters/{cluster.pk}/enrollment-tokens/", {}, format="json")
    assert api.status_code == 201 and api.json()["max_uses"] == ENROLLMENT_TOKEN_MAX_USES
    page = world.session("carol").get(f"/clusters/{cluster.pk}/")
    assert f'name="max_uses" type="number" min="1" value="{ENROLLMENT_TOKEN_MAX_USES}"' in page.content.decode()
    call_command("create_enrollment_token", str(cluster.pk))
    plaintext = capsys.readouterr().out.strip().splitlines()[-1]
    assert plaintext.startswith("lse_")
    tokens = EnrollmentToken.objects.filter(cluster=cluster).order_by("created")
    assert [t.max_uses for t in tokens] == [ENROLLMENT_TOKEN_MAX_USES] * 2
    for t in tokens:
        assert abs((t.expires - t.created) - ENROLLMENT_TOKEN_TTL) < timedelta(minutes=1)
