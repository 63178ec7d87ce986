import pytest

from console.tenancy.models import Membership, Organization, Role

pytestmark = pytest.mark.django_db


def test_an_owner_adds_changes_and_removes_members(world, django_user_model):
    django_user_model.objects.create_user("dave", email="dave@example.test", password="x")
    alice = world.client("alice")
    added = alice.post("/api/v1/members/", {"organization": world.acme.pk, "email": "dave@example.test",
                                            "role": "operator"}, format="json")
    assert added.status_code == 201 and added.json()["user"]["username"] == "dave"
    member_id = added.json()["id"]
    assert alice.patch(f"/api/v1/members/{member_id}/", {"role": "viewer"}, format="json").json()["role"] == "viewer"
    assert alice.delete(f"/api/v1/members/{member_id}/").status_code == 204
    assert not Membership.objects.filter(user__username="dave").exists()


def test_adding_an_unknown_or_existing_member_names_the_problem(world):
    alice = world.client("alice")
    unknown = alice.post("/api/v1/members/", {"organization": world.acme.pk, "email": "nobody@x.test"}, format="json")
    assert unknown.status_code == 400 and "No active user" in unknown.json()["fields"]["email"]
    again = alice.post("/api/v1/members/", {"organization": world.acme.pk, "email": "bob@example.test"}, format="json")
    assert again.status_code == 409 and "already a member" in again.json()["fields"]["email"]


def test_an_operator_cannot_manage_members(world):
    response = world.client("carol").post("/api/v1/members/", {"organization": world.acme.pk,
                                                               "email": "charlie@example.test"}, format="json")
    assert response.status_code == 403
    assert not Membership.objects.filter(organization=world.acme, user=world.users["charlie"]).exists()


def test_the_last_owner_can_be_neither_demoted_nor_removed(world):
    alice = world.client("alice")
    own = Membership.objects.get(user=world.users["alice"])
    demote = alice.patch(f"/api/v1/members/{own.pk}/", {"role": "viewer"}, format="json")
    assert demote.status_code == 409 and "at least one owner" in demote.json()["fields"]["role"]
    assert alice.delete(f"/api/v1/members/{own.pk}/").status_code == 409
    assert Membership.objects.get(pk=own.pk).role == Role.OWNER


def test_a_signed_in_user_creates_an_organization_and_owns_it(world):
    response = world.session("bob").post("/api/v1/organizations/", {"name": "Bob's Lab"}, format="json")
    assert response.status_code == 201 and response.json()["role"] == "owner"
    org = Organization.objects.get(name="Bob's Lab")
    assert org.slug == "bobs-lab"
    assert Membership.objects.get(organization=org).user == world.users["bob"]
    with_token = world.client("bob").post("/api/v1/organizations/", {"name": "Token Org"}, format="json")
    assert with_token.status_code == 403
