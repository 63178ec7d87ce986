from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from console.tenancy.models import ApiToken, Membership, Organization, Role, TokenScope

pytestmark = pytest.mark.django_db


def test_create_organization_prints_a_working_write_token_as_the_last_line(client):
    out = io.StringIO()
    call_command("create_organization", "Initech", "--admin-email", "ops@initech.test", stdout=out)
    token = out.getvalue().strip().splitlines()[-1]
    stored = ApiToken.lookup(token)
    assert stored is not None and stored.scope == TokenScope.WRITE
    org = Organization.objects.get(name="Initech")
    assert Membership.objects.get(organization=org).role == Role.OWNER
    from rest_framework.test import APIClient

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = api.post("/api/v1/clusters/", {"name": "prod"}, format="json")
    assert response.status_code == 201 and response.json()["organization"] == org.pk


def test_create_organization_refuses_bad_input_and_changes_nothing():
    with pytest.raises(CommandError, match="not an email address"):
        call_command("create_organization", "Initech", "--admin-email", "nope", stdout=io.StringIO())
    call_command("create_organization", "Initech", "--admin-email", "a@initech.test", stdout=io.StringIO())
    with pytest.raises(CommandError, match="named 'Initech' exists"):
        call_command("create_organization", "Initech", "--admin-email", "b@initech.test", stdout=io.StringIO())
    assert Organization.objects.count() == 1
