from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.fleet.models import EnrollmentToken, NodeCredential
from console.tenancy.models import ApiToken, Membership
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


def _all_values(model) -> str:
    return " ".join(str(v) for row in model.objects.values() for v in row.values())


def test_api_tokens_are_stored_as_a_digest_never_in_clear(world):
    plaintext = world.token("alice")
    key, secret = plaintext.removeprefix("lst_").split(".")
    stored = ApiToken.objects.get(key=key)
    assert stored.digest != secret and len(stored.digest) == 64
    assert secret not in _all_values(ApiToken)
    assert ApiToken.lookup(plaintext) == stored
    assert ApiToken.lookup(f"lst_{key}.wrong-secret") is None


def test_enrollment_tokens_and_node_credentials_are_stored_hashed_too(world):
    fleet = make_fleet(world.acme)
    credential_secret = fleet.credential.split(".", 1)[1]
    assert credential_secret not in _all_values(NodeCredential)
    assert NodeCredential.lookup(fleet.credential).node == fleet.node
    assert all(len(t.digest) == 64 for t in EnrollmentToken.objects.all())


def test_a_valid_token_works_and_records_its_last_use(world):
    plaintext = world.token("alice")
    client = world.client(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert client.get("/api/v1/clusters/").status_code == 200
    assert ApiToken.lookup(plaintext).last_used is not None


def test_an_expired_token_is_refused_with_a_reason(world):
    plaintext = world.token("alice")
    ApiToken.objects.filter(key=plaintext[4:16]).update(expires=timezone.now() - timedelta(seconds=1))
    client = world.client(None)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = client.get("/api/v1/clusters/")
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_a_revoked_token_is_refused(world):
    plaintext = world.token("alice")
    owner = world.client(None)
    owner.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    token_id = ApiToken.lookup(plaintext).pk
    assert owner.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    response = owner.get("/api/v1/clusters/")
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]
    assert ApiToken.objects.get(pk=token_id).revoked_at is not None  # kept for the audit trail


def test_a_malformed_or_unknown_token_is_refused(world):
    client = world.client(None)
    client.credentials(HTTP_AUTHORIZATION="Bearer lst_AAAAAAAAAAAA.nope")
    assert client.get("/api/v1/clusters/").status_code == 401


def test_a_read_token_cannot_write_even_for_an_owner(world):
    client = world.client("alice", scope="read")
    response = client.post("/api/v1/clusters/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert "read scope" in response.json()["detail"]


def test_a_token_stops_working_when_its_user_leaves_the_organization(world):
    fleet = make_fleet(world.acme)
    client = world.client("carol")
    assert client.get(f"/api/v1/clusters/{fleet.cluster.pk}/").status_code == 200
    Membership.objects.filter(user=world.users["carol"]).delete()
    assert client.get(f"/api/v1/clusters/{fleet.cluster.pk}/").status_code == 404


def test_creating_a_token_shows_the_secret_once(world):
    client = world.session("bob")
    response = client.post("/api/v1/tokens/", {"name": "ci", "scope": "read"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["token"].startswith("lst_") and body["organization"] == world.acme.pk
    listed = client.get(f"/api/v1/tokens/{body['id']}/").json()
    assert "token" not in listed and listed["prefix"] == body["token"].split(".")[0]


# --- tokens minted by tokens (issue 9, finding 5) ------------------------------------------------


def _bearer(plaintext: str):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def _mint(client, **body):
    return client.post("/api/v1/tokens/", {"name": "child", **body}, format="json")


def test_a_token_minted_by_a_token_dies_with_its_parent_at_any_depth(world):
    parent_plaintext = world.token("alice")
    parent = _bearer(parent_plaintext)
    child = _mint(parent, scope="write")
    assert child.status_code == 201, child.content
    grandchild = _mint(_bearer(child.json()["token"]), scope="write")
    assert grandchild.status_code == 201, grandchild.content
    parent_id = ApiToken.lookup(parent_plaintext).pk

    assert parent.delete(f"/api/v1/tokens/{parent_id}/").status_code == 204
    for minted in (child, grandchild):
        response = _bearer(minted.json()["token"]).get("/api/v1/clusters/")
        assert response.status_code == 401 and "revoked" in response.json()["detail"]


def test_a_child_token_never_outlives_its_parent(world):
    parent_expires = timezone.now() + timedelta(days=2)
    plaintext = tenancy_mint(world, "alice", expires=parent_expires)
    parent = _bearer(plaintext)

    inherited = _mint(parent, scope="write")
    assert inherited.status_code == 201
    assert inherited.json()["expires"] == parent_expires.isoformat().replace("+00:00", "Z")

    later = _mint(parent, scope="write", expires=(parent_expires + timedelta(days=1)).isoformat())
    assert later.status_code == 400 and "expires" in later.json()["fields"]
    assert ApiToken.objects.filter(name="child").count() == 1


def test_a_read_token_cannot_mint_a_write_token(world):
    response = _mint(_bearer(world.token("alice", scope="read")), scope="write")
    # a read token writes nothing at all, so it cannot mint either; a write token minting read is fine
    assert response.status_code == 403
    assert _mint(_bearer(world.token("alice")), scope="read").status_code == 201


def test_an_expiry_in_the_past_is_refused(world):
    response = _mint(world.session("alice"), expires=(timezone.now() - timedelta(minutes=1)).isoformat())
    assert response.status_code == 400 and response.json()["fields"]["expires"]
    assert not ApiToken.objects.filter(name="child").exists()


def tenancy_mint(world, name: str, **kwargs) -> str:
    from console.tenancy import services

    user = world.users[name]
    organization = Membership.objects.filter(user=user).first().organization
    return services.mint_api_token(organization.pk, user, name=f"{name}-parent", scope="write", **kwargs).plaintext
