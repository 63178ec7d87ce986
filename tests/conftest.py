"""Shared fixtures: two organizations and three people, as in every tenant test.

- alice: owner of Acme
- bob: viewer in Acme (a member with the lowest role)
- carol: operator in Acme
- charlie: owner of Globex, an outsider to Acme
"""

from __future__ import annotations

import os

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from console.core import scoping
from console.telemetry import kinds
from console.tenancy import services as tenancy
from console.tenancy.models import Membership, Organization, Role, TokenScope

POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
REDIS = bool(settings.REDIS_URL)

needs_postgres = pytest.mark.skipif(not POSTGRES, reason="needs PostgreSQL: set DATABASE_URL (CI does)")
needs_redis = pytest.mark.skipif(not REDIS, reason="needs Redis: set REDIS_URL (CI does)")


def pytest_report_header(config):
    return [f"lockstep: database={'postgresql' if POSTGRES else 'sqlite'} redis={'yes' if REDIS else 'no'}"]


@pytest.fixture(autouse=True)
def _test_settings(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # In-process tests run inside one transaction per test: agent endpoints must do their ORM
    # work on the test's thread. The thread pool itself is exercised by the live-server tests.
    settings.LOCKSTEP = {**settings.LOCKSTEP, "DB_THREAD_POOL": False}


@pytest.fixture(autouse=True)
def _fresh_local_cache():
    """Throttles kept in the cache are keyed by row ids, which SQLite hands out again after a
    test's rollback: a previous test's key must not throttle this one. (Redis, shared with the
    live-server tests' processes, is left alone; PostgreSQL never reuses an id.)"""
    yield
    from django.core.cache import caches
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(caches["default"], LocMemCache):
        caches["default"].clear()


@pytest.fixture(autouse=True)
def _test_body_unscoped():
    """The test itself arranges and inspects rows of every organization. What it exercises still
    starts closed and enters its own scope: every HTTP request (middleware), agent request,
    viewset, page, websocket consumer and Celery task, so a forgotten scope fails here too."""
    with scoping.unscoped("a test arranges and inspects rows of every organization"):
        yield


class World:
    """The people and organizations of a test, with API clients acting for each."""

    def __init__(self, django_user_model):
        self.acme = Organization.objects.create(name="Acme", slug="acme")
        self.globex = Organization.objects.create(name="Globex", slug="globex")
        self.users = {}
        for name, org, role in (
            ("alice", self.acme, Role.OWNER),
            ("bob", self.acme, Role.VIEWER),
            ("carol", self.acme, Role.OPERATOR),
            ("charlie", self.globex, Role.OWNER),
        ):
            user = django_user_model.objects.create_user(username=name, email=f"{name}@example.test", password="pw-" + name)
            Membership.objects.create(organization=org, user=user, role=role)
            self.users[name] = user

    def token(self, name: str, scope: str = TokenScope.WRITE, organization=None) -> str:
        user = self.users[name]
        organization = organization or Membership.objects.filter(user=user).first().organization
        return tenancy.mint_api_token(organization.pk, user, name=f"{name}-{scope}", scope=scope).plaintext

    def client(self, name: str | None, scope: str = TokenScope.WRITE) -> APIClient:
        client = APIClient()
        if name is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.token(name, scope)}")
        return client

    def session(self, name: str) -> APIClient:
        client = APIClient()
        client.force_login(self.users[name])
        return client


@pytest.fixture
def world(db, django_user_model) -> World:
    return World(django_user_model)


TEST_KIND = "test.sample"


@pytest.fixture
def test_telemetry_kind(monkeypatch):
    """`test.sample`: a telemetry kind only the tests post (any bounded object), with a handler
    list the test can fill."""
    kind = kinds.TelemetryKind(TEST_KIND, "A kind only the tests post.", validate=kinds.shape({}))
    monkeypatch.setitem(kinds._kinds, TEST_KIND, kind)
    return kind


@pytest.fixture
def topology_doc():
    """A small rail-optimized fabric: 4 hosts × 2 rails, 2 leaves per rail, 2 spines."""
    hosts = [f"node{i}" for i in range(4)]
    doc = {
        "format": "lockstep.topology/v1",
        "name": "rail2-n4",
        "hosts": [{"name": h} for h in hosts],
        "switches": [{"name": f"leaf-r{r}-{g}", "tier": "leaf"} for r in range(2) for g in range(2)]
        + [{"name": f"spine-{s}", "tier": "spine"} for s in range(2)],
        "nics": [{"name": f"{h}/nic{r}", "host": h, "rail": r} for h in hosts for r in range(2)],
        "links": [],
    }
    for i, h in enumerate(hosts):
        for r in range(2):
            doc["links"].append({"id": f"{h}/nic{r}~leaf-r{r}-{i // 2}", "a": f"{h}/nic{r}", "b": f"leaf-r{r}-{i // 2}"})
    for r in range(2):
        for g in range(2):
            for s in range(2):
                doc["links"].append({"id": f"leaf-r{r}-{g}~spine-{s}#0", "a": f"leaf-r{r}-{g}", "b": f"spine-{s}"})
    return doc


SCENARIOS_DIR = os.path.join(os.path.dirname(__file__), "data", "scenarios")  # copied from shared/scenarios
