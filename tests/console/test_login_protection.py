"""Sign-in is rate limited and the admin site is off (issue 9, finding 4), tested through the
sign-in form as a browser or a script would post it."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db


def _sign_in(username: str, password: str, address: str = "203.0.113.7"):
    client = Client(REMOTE_ADDR=address)
    response = client.post("/login/", {"username": username, "password": password})
    return response, "_auth_user_id" in client.session


def test_after_the_failure_limit_even_the_right_password_is_refused(world):
    for _ in range(60):  # what the finding sent before the right password signed in
        response, signed_in = _sign_in("alice", "wrong")
        assert not signed_in and response.status_code in (200, 429)
    response, signed_in = _sign_in("alice", "pw-alice")
    assert response.status_code == 429 and not signed_in
    assert b"too many" in response.content.lower()


def test_a_lockout_holds_one_username_from_one_address_only(world):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _sign_in("alice", "wrong")
    assert _sign_in("bob", "pw-bob")[1]  # another user at the same address
    assert _sign_in("alice", "pw-alice", address="198.51.100.9")[1]  # the user at another address


def test_a_success_before_the_limit_resets_the_count(world):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _sign_in("alice", "wrong")
    assert _sign_in("alice", "pw-alice")[1]
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _sign_in("alice", "wrong")
    assert _sign_in("alice", "pw-alice")[1]


def test_the_admin_site_is_not_served_by_default(world):
    client = Client()
    assert client.get("/admin/").status_code == 404
    assert client.get("/admin/login/").status_code == 404
    client.force_login(world.users["alice"])
    assert client.get("/admin/").status_code == 404
