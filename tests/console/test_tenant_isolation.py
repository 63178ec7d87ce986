"""Tenant isolation, tested from outside, on every route the API has — generated, not listed.

The operations come from the OpenAPI schema (every path and method), and the URL router is
checked against it: a route missing from the schema fails `test_every_api_route_is_in_the_schema_
or_covered_here` until it is documented or given its own test below (the agent routes are). So an
endpoint is covered the day it is added, and one this module cannot exercise (no Acme object to
point it at, a required parameter it cannot fill) fails rather than being skipped.

Three people, two organizations (tests/conftest.py): alice owns Acme, bob is a viewer in Acme,
charlie owns Globex and is an outsider to Acme. For every operation:

- the outsider gets 404 on every Acme object, sees no Acme row in any list, cannot create
  anything that points at Acme, and nothing of Acme changes;
- a member reads everything and changes nothing without the role;
- the owner reaches the route (no 404 or 405: the object and the URL are real);
- an anonymous caller gets 401.

And the filter oracle: `?cluster=<another tenant's id>` answers exactly like `?cluster=<an id
that does not exist>`, on every list and every foreign-key filter.
"""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django_filters import ModelChoiceFilter, ModelMultipleChoiceFilter
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from console.core.models import TenantOwned
from console.incidents.models import Incident
from console.jobs.models import Job
from console.tenancy.models import Role
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db

SCHEMA = SchemaGenerator().get_schema(request=None, public=True)
OPERATIONS = sorted((path, method) for path, ops in SCHEMA["paths"].items() for method in ops)
UNSAFE = {"post", "put", "patch", "delete"}
PATH_PARAMETER = re.compile(r"\{(\w+)\}")

# Routes under /api/v1/ that are not operations of the schema, and what covers them.
NOT_IN_SCHEMA = {
    "api-root": "the router's index of routes: names, no tenant data",
    "schema": "the OpenAPI schema itself (tests/console/test_schema.py)",
    "api-docs": "the Swagger page of the schema",
    "agent-enroll": "test_agent_routes_never_reach_another_tenant",
    "agent-heartbeat": "test_agent_routes_never_reach_another_tenant",
    "agent-commands": "test_agent_routes_never_reach_another_tenant",
    "agent-command-result": "test_agent_routes_never_reach_another_tenant",
    "agent-telemetry": "test_agent_routes_never_reach_another_tenant",
    "agent-inventory": "test_agent_routes_never_reach_another_tenant",
}


def _id(operation) -> str:
    path, method = operation
    return f"{method.upper()} {path}"


def _resource(path: str) -> str:
    return path.removeprefix("/api/v1/").split("/")[0]


def _view(path: str):
    return resolve(PATH_PARAMETER.sub("1", path)).func


def _operation(path: str, method: str) -> dict:
    return SCHEMA["paths"][path][method]


def _tenant_models():
    return [m for m in apps.get_models() if issubclass(m, TenantOwned)]


# Bookkeeping of authentication (a caller's own token noting it was used), not a change to Acme.
VOLATILE = {"last_used"}


def snapshot(organization) -> dict:
    """Every row of the organization, every column: what no outsider may change."""
    out = {}
    for model in _tenant_models():
        rows = model._base_manager.filter(**{model.tenant_field: organization.pk}).order_by("pk")
        out[model._meta.label] = [tuple(sorted((k, v) for k, v in row.items() if k not in VOLATILE))
                                  for row in rows.values()]
    return out


class Acme:
    """The objects of Acme the generated requests point at, found the way a client finds them."""

    def __init__(self, world, fleet):
        self.world, self.fleet = world, fleet
        self.owner = APIClient()
        self.owner.force_login(world.users["alice"])  # a session: owners also create organizations
        self.member = world.client("bob")  # a write-scoped token of a viewer
        self.outsider = world.client("charlie")
        self.anonymous = APIClient()
        world.token("bob")  # bob owns a token of Acme too, so he can list one

    def object_id(self, path: str, client: APIClient | None = None):
        """The first Acme row of the resource as `client` (the owner by default) lists it."""
        resource = _resource(path)
        response = (client or self.owner).get(f"/api/v1/{resource}/", {"limit": 1000})
        assert response.status_code == 200, f"cannot list /api/v1/{resource}/ to find an Acme object for {path}"
        key = "id" if resource == "organizations" else "organization"
        rows = [row for row in response.json()["results"] if row.get(key) == self.world.acme.pk]
        if not rows:
            pytest.fail(f"{path}: no Acme object to exercise it with. Make tests.factories.make_fleet create one.")
        return rows[0]["id"]

    def url(self, path: str, method: str, client: APIClient | None = None) -> str:
        names = PATH_PARAMETER.findall(path)
        if set(names) - {"id"}:
            pytest.fail(f"{path}: path parameters {names} — teach this module how to fill them")
        url = path.replace("{id}", str(self.object_id(path, client))) if names else path
        query = []
        for parameter in _operation(path, method).get("parameters", []):
            if parameter["in"] == "query" and parameter.get("required"):
                if parameter["name"] not in self.required_query:
                    pytest.fail(f"{path}: required query parameter {parameter['name']!r} — add it to "
                                "Acme.required_query")
                query.append(f"{parameter['name']}={self.required_query[parameter['name']]}")
        return url + ("?" + "&".join(query) if query else "")

    @property
    def required_query(self) -> dict[str, str]:
        host = self.fleet.node.name
        return {"src": f"{host}/nic0", "dst": f"{host[:-1]}1/nic0"}

    def references(self) -> dict[str, int]:
        """What a body may point at: Acme's organization, cluster and node."""
        return {"organization": self.world.acme.pk, "cluster": self.fleet.cluster.pk, "node": self.fleet.node.pk}

    def body(self, path: str, method: str):
        """A request body from the schema: every reference points at Acme, required fields filled."""
        content = _operation(path, method).get("requestBody", {}).get("content", {})
        schema = (content.get("application/json") or {}).get("schema")
        if schema is None:
            return None
        if "$ref" in schema:
            schema = SCHEMA["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        properties = schema.get("properties", {})
        body = {}
        for name, spec in properties.items():
            if name in self.references():
                body[name] = self.references()[name]
            elif name in schema.get("required", ()):
                body[name] = _example(spec)
        return body


def _example(spec: dict):
    if "enum" in spec:
        return spec["enum"][0]
    kind = spec.get("type")
    if kind == "string":
        return "dave@example.test" if spec.get("format") == "email" else "isolation-check"
    if kind == "integer":
        return max(1, spec.get("minimum", 1))
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    return {}


@pytest.fixture
def acme(world):
    acme_fleet = make_fleet(world.acme, "acme-cluster")
    make_fleet(world.globex, "globex-cluster")
    return Acme(world, acme_fleet)


def _call(client: APIClient, method: str, url: str, body=None):
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


def _rolled_back(fn):
    """Run a request that may change things, and undo what it did."""
    with transaction.atomic():
        sid = transaction.savepoint()
        try:
            return fn()
        finally:
            transaction.savepoint_rollback(sid)


# --- coverage -----------------------------------------------------------------------------------


def _routes():
    """(url name, method) of every route under /api/v1/, from the URL router."""
    found = set()

    def walk(patterns, prefix):
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, route)
            elif isinstance(entry, URLPattern) and route.lstrip("^").startswith("api/v1/"):
                callback = entry.callback
                if hasattr(callback, "actions"):  # a viewset (405 for what http_method_names leaves out;
                    # DRF adds `head` for `get` on the first request: HEAD is GET without a body)
                    methods = {m for m in callback.actions if m in callback.cls.http_method_names and m != "head"}
                elif hasattr(callback, "view_class"):
                    methods = {m for m in callback.view_class.http_method_names
                               if m not in ("options", "head") and hasattr(callback.view_class, m)}
                else:
                    methods = {m.lower() for m in getattr(callback, "http_methods", ())}
                assert methods, f"{route}: cannot tell which methods it answers"
                found.update((entry.name, m) for m in methods)

    walk(get_resolver().url_patterns, "")
    return found


def test_every_api_route_is_in_the_schema_or_covered_here():
    routes = _routes()
    documented = {(resolve(PATH_PARAMETER.sub("1", path)).url_name, method) for path, method in OPERATIONS}
    uncovered = {route for route in routes - documented if route[0] not in NOT_IN_SCHEMA}
    assert not uncovered, (f"routes neither in the OpenAPI schema nor covered here: {sorted(uncovered)}. "
                           "Document them (extend_schema), or add them to NOT_IN_SCHEMA with the test that covers them.")
    stale = set(NOT_IN_SCHEMA) - {name for name, _ in routes}
    assert not stale, f"NOT_IN_SCHEMA names routes that no longer exist: {sorted(stale)}"
    assert len(OPERATIONS) >= 50  # the schema is whole (a broken generator yields a handful)


# --- every operation, three people and nobody ----------------------------------------------------


@pytest.mark.parametrize("operation", OPERATIONS, ids=_id)
def test_an_outsider_gets_404_or_a_refusal_and_changes_nothing(acme, operation):
    path, method = operation
    url, body = acme.url(path, method), acme.body(path, method)
    before = snapshot(acme.world.acme)
    response = _call(acme.outsider, method, url, body)
    if "{id}" in path:
        assert response.status_code == 404, (response.status_code, response.content[:300])
        assert response.json()["error"] == "not_found"
    elif method == "get":
        assert response.status_code == 200
        rows = response.json()
        rows = rows["results"] if isinstance(rows, dict) else rows
        key = "id" if _resource(path) == "organizations" else "organization"
        assert all(row.get(key) != acme.world.acme.pk for row in rows), f"{path} lists Acme's rows to an outsider"
    else:
        assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert snapshot(acme.world.acme) == before


@pytest.mark.parametrize("operation", OPERATIONS, ids=_id)
def test_a_member_reads_everything_and_changes_nothing_without_the_role(acme, operation):
    path, method = operation
    url, body = acme.url(path, method, client=acme.member), acme.body(path, method)
    if method == "get":
        response = _call(acme.member, method, url)
        assert response.status_code == 200, (response.status_code, response.content[:300])
        return
    view = _view(path)
    if getattr(getattr(view, "cls", None), "write_role", Role.OPERATOR) == Role.VIEWER:
        return  # every member manages their own API tokens
    before = snapshot(acme.world.acme)
    response = _call(acme.member, method, url, body)
    assert response.status_code in (400, 403), (response.status_code, response.content[:300])
    assert snapshot(acme.world.acme) == before


@pytest.mark.parametrize("operation", OPERATIONS, ids=_id)
def test_the_owner_reaches_every_route(acme, operation):
    path, method = operation
    url, body = acme.url(path, method), acme.body(path, method)
    response = _rolled_back(lambda: _call(acme.owner, method, url, body))
    assert response.status_code not in (401, 403, 404, 405) and response.status_code < 500, (
        f"{method.upper()} {url}: the owner got {response.status_code}, so this test did not really exercise the "
        f"route: {response.content[:300]!r}"
    )


@pytest.mark.parametrize("operation", OPERATIONS, ids=_id)
def test_an_anonymous_caller_is_refused(acme, operation):
    path, method = operation
    response = _call(acme.anonymous, method, acme.url(path, method), acme.body(path, method))
    assert response.status_code == 401, (response.status_code, response.content[:300])


def test_an_outsider_with_a_session_gets_404_too(acme):
    charlie = APIClient()
    charlie.force_login(acme.world.users["charlie"])
    for path, method in OPERATIONS:
        if method == "get" and "{id}" in path:
            assert charlie.get(acme.url(path, method)).status_code == 404, path


# --- the filter oracle ------------------------------------------------------------------------------


def _reference_filters():
    """(list path, query parameter, model) of every foreign-key filter of every list route."""
    out = []
    for path, method in OPERATIONS:
        if method != "get" or "{" in path:
            continue
        filterset = getattr(getattr(_view(path), "cls", None), "filterset_class", None)
        for parameter in _operation(path, method).get("parameters", []):
            declared = filterset.base_filters.get(parameter["name"]) if filterset else None
            if isinstance(declared, (ModelChoiceFilter, ModelMultipleChoiceFilter)):
                out.append((path, parameter["name"], declared.queryset.model))
    return out


REFERENCE_FILTERS = _reference_filters()


def test_the_lists_filter_by_organization_cluster_and_node():
    assert {name for _, name, _ in REFERENCE_FILTERS} >= {"organization", "cluster", "node"}
    assert len({path for path, _, _ in REFERENCE_FILTERS}) >= 10


@pytest.mark.parametrize(("path", "parameter", "model"), REFERENCE_FILTERS,
                         ids=[f"{p}?{n}=" for p, n, _ in REFERENCE_FILTERS])
def test_another_tenants_id_in_a_filter_answers_like_an_id_that_does_not_exist(acme, path, parameter, model):
    foreign = model._base_manager.filter(**{model.tenant_field: acme.world.acme.pk}).order_by("pk").first()
    assert foreign is not None, f"no Acme {model._meta.label} to filter {path} by"
    absent = (model._base_manager.order_by("-pk").values_list("pk", flat=True).first() or 0) + 10**6

    def answer(value):
        response = acme.outsider.get(path, {parameter: value})
        return response.status_code, response.content.decode().replace(str(value), "<id>")

    assert answer(foreign.pk) == answer(absent)
    # and the filter does work for those who may see the object
    own = acme.member.get(path, {parameter: foreign.pk})
    assert own.status_code == 200, own.content[:300]


# --- the agent routes ---------------------------------------------------------------------------------


def test_agent_routes_never_reach_another_tenant(acme, world):
    """Agent routes act on the node whose credential calls them; what they name of another
    tenant (a command, a cluster) is not found or refused, and nothing of Acme changes."""
    from django.test import Client

    globex = make_fleet(world.globex, "globex-second")
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {globex.credential}")
    before = snapshot(world.acme)
    acme_command = acme.fleet.command.pk
    result = agent.post(f"/api/v1/agent/commands/{acme_command}/result", {"status": "succeeded", "result": {}},
                        content_type="application/json")
    assert result.status_code == 404 and result.json()["error"] == "not_found"
    polled = agent.get("/api/v1/agent/commands", {"wait": 0}).json()["commands"]
    assert str(acme_command) not in {c["id"] for c in polled}
    enrolled = Client().post("/api/v1/agent/enroll", {"token": globex_token(globex), "cluster_id": acme.fleet.cluster.pk,
                                                      "host": {"hostname": "h", "machine_id": "m"}},
                             content_type="application/json")
    assert enrolled.status_code == 403 and enrolled.json()["error"] == "enrollment_token_wrong_cluster"
    for route, body in (("heartbeat", {}), ("telemetry", {"seq": 99, "records": []})):
        assert agent.post(f"/api/v1/agent/{route}", body, content_type="application/json").status_code < 300
    inventory = agent.put("/api/v1/agent/inventory", {"format": "lockstep.inventory/v1", "host": {"hostname":
                          acme.fleet.node.name}}, content_type="application/json")
    assert inventory.status_code == 200
    assert snapshot(world.acme) == before


def globex_token(fleet) -> str:
    from tests.factories import make_enrollment_token

    return make_enrollment_token(fleet.cluster)


# --- the pages ------------------------------------------------------------------------------------

# What each path parameter of a page names, as an Acme object.
PAGE_OBJECTS = {
    "pk": lambda acme: acme.fleet.cluster.pk,  # /clusters/<pk>/...
    "token_pk": lambda acme: acme.fleet.enrollment_token.pk,
    "audit_pk": lambda acme: acme.fleet.audit.pk,  # /audits/<audit_pk>/...
    "job_pk": lambda acme: Job.objects.get(cluster=acme.fleet.cluster).pk,  # /jobs/<job_pk>/
    "incident_pk": lambda acme: Incident.objects.get(cluster=acme.fleet.cluster).pk,
}
# Routes outside /api/v1/ that name no tenant object (their parameters, if any, are not tenant
# objects), and what keeps them tenant-safe.
PAGES_WITHOUT_OBJECTS = {
    "home": "redirects to the clusters page",
    "healthz": "answers 'ok', no data",
    "login": "the sign-in form",
    "logout": "signs out",
    "switch-organization": "a foreign or bogus organization answers 404 (test_web)",
    "clusters": "lists the active organization's clusters only (test_web)",
    "invitations": "lists and accepts only invitations addressed to the user's e-mail (test_members)",
    "metrics": "a token or an allowed network only (test_metrics)",
    "install-script": "public: the installer, no tenant data",
    "agent-package": "public: the agent package and its checksum",
}


def _pages():
    """(url name, path parameters) of every route outside /api/v1/ and the admin site."""
    found = {}

    def walk(patterns, prefix, namespace):
        for entry in patterns:
            route = prefix + str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, route, entry.namespace or namespace)
            elif not route.lstrip("^").startswith("api/v1/") and namespace != "admin":
                found[entry.name] = tuple(getattr(entry.pattern, "converters", {}))

    walk(get_resolver().url_patterns, "", None)
    return found


PAGES = {name: params for name, params in _pages().items() if params and name not in PAGES_WITHOUT_OBJECTS}


def test_every_page_route_is_generated_here_or_says_why_it_is_safe():
    pages = _pages()
    unknown = {name for name, params in pages.items() if not params and name not in PAGES_WITHOUT_OBJECTS}
    assert not unknown, f"pages that name no object and are not explained in PAGES_WITHOUT_OBJECTS: {unknown}"
    assert not set(PAGES_WITHOUT_OBJECTS) - set(pages), "PAGES_WITHOUT_OBJECTS names pages that are gone"
    strangers = {p for params in PAGES.values() for p in params} - set(PAGE_OBJECTS)
    assert not strangers, f"page parameters this module cannot fill: {strangers} (add them to PAGE_OBJECTS)"


def test_the_admin_site_shows_no_tenant_model():
    from django.contrib import admin

    assert not [m for m in admin.site._registry if issubclass(m, TenantOwned)]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_an_outsider_gets_404_on_every_page_of_another_organization(acme, name):
    from django.test import Client
    from django.urls import reverse

    url = reverse(name, kwargs={param: PAGE_OBJECTS[param](acme) for param in PAGES[name]})
    outsider, owner = Client(), Client()
    outsider.force_login(acme.world.users["charlie"])
    owner.force_login(acme.world.users["alice"])
    before = snapshot(acme.world.acme)
    answers = {method: getattr(outsider, method)(url, {"description": "x"} if method == "post" else None).status_code
               for method in ("get", "post")}
    assert set(answers.values()) <= {404, 405} and 404 in answers.values(), answers
    assert snapshot(acme.world.acme) == before
    reached = [_rolled_back(lambda m=method: getattr(owner, m)(url).status_code) for method in ("get", "post")]
    assert any(status not in (404, 405) for status in reached), f"{url}: the owner reached it with neither method"
