import pytest

from console.tenancy.models import Membership, Organization, Role

pytestmark = pytest.mark.django_db


def _invite(client, organization, email, role="operator"):
    return client.post("/api/v1/members/", {"organization": organization.pk, "email": email, "role": role},
                       format="json")


def _accept(user, invitation_id, action="accept"):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.post("/invitations/", {"invitation": invitation_id, "action": action})


def test_an_owner_invites_and_the_member_joins_only_by_accepting(world, django_user_model):
    dave = django_user_model.objects.create_user("dave", email="dave@example.test", password="x")
    alice = world.client("alice")
    invited = _invite(alice, world.acme, "Dave@Example.test")
    assert invited.status_code == 202, invited.content
    assert not Membership.objects.filter(user=dave).exists()  # nobody joins without consent

    accepted = _accept(dave, invited.json()["id"])
    assert accepted.status_code == 302
    member = Membership.objects.get(user=dave)
    assert (member.organization, member.role) == (world.acme, Role.OPERATOR)
    assert alice.patch(f"/api/v1/members/{member.pk}/", {"role": "viewer"}, format="json").json()["role"] == "viewer"
    assert alice.delete(f"/api/v1/members/{member.pk}/").status_code == 204
    assert not Membership.objects.filter(user=dave).exists()


def test_adding_another_tenants_owner_neither_adds_them_nor_tells_them_apart_from_nobody(world):
    """Issue 9, finding 9: charlie (owner of Globex) was added to Acme without consent, and
    the answer showed his user id, where an unknown address was a 400."""
    alice = world.client("alice")
    known = _invite(alice, world.acme, "charlie@example.test")
    unknown = _invite(alice, world.acme, "nobody@example.test")
    assert known.status_code == unknown.status_code == 202

    def shape(response):  # the answer, less what differs by address and time
        return {k: (type(v).__name__ if k in ("id", "email", "created", "expires") else v)
                for k, v in response.json().items()}

    assert shape(known) == shape(unknown)
    assert "user" not in known.json()
    assert not Membership.objects.filter(organization=world.acme, user=world.users["charlie"]).exists()


def test_an_invitation_is_accepted_only_by_the_person_invited(world):
    invited = _invite(world.client("alice"), world.acme, "charlie@example.test").json()
    for intruder in ("bob", "carol"):
        assert _accept(world.users[intruder], invited["id"]).status_code == 404
    from django.test import Client

    bob_page = Client()
    bob_page.force_login(world.users["bob"])
    assert b"Acme" not in bob_page.get("/invitations/").content.split(b"<main>")[1]
    charlie_page = Client()
    charlie_page.force_login(world.users["charlie"])
    assert f'data-invitation="{invited["id"]}"'.encode() in charlie_page.get("/invitations/").content
    assert _accept(world.users["charlie"], invited["id"], action="decline").status_code == 302
    assert _accept(world.users["charlie"], invited["id"]).status_code == 404  # declined is gone
    assert not Membership.objects.filter(organization=world.acme, user=world.users["charlie"]).exists()


def test_inviting_a_member_again_names_the_problem(world):
    again = _invite(world.client("alice"), world.acme, "bob@example.test")
    assert again.status_code == 409 and "already a member" in again.json()["fields"]["email"]


def test_the_member_list_filter_answers_the_same_for_another_tenant_and_for_nothing(world):
    """The filter oracle (fixed on main): ?organization=<Globex> on /members/ answers like an
    organization that does not exist."""
    alice = world.client("alice")
    foreign = alice.get("/api/v1/members/", {"organization": world.globex.pk})
    absent = alice.get("/api/v1/members/", {"organization": world.globex.pk + 10**6})
    assert foreign.status_code == absent.status_code
    assert foreign.content.decode().replace(str(world.globex.pk), "<id>") == \
        absent.content.decode().replace(str(world.globex.pk + 10**6), "<id>")


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
