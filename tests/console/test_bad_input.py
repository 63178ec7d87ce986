"""Bad input answers 4xx naming the field, and changes nothing (issue 9, finding 8).

Each case is one of the server errors (500s) found from outside with production settings: sent
as a client would send it, over HTTP to the API and the agent routes, it must get a 4xx in the
API's error shape, the field to blame named, and the stored data unchanged.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import get_resolver
from rest_framework.routers import DefaultRouter

from api.urls import router
from console.incidents.models import Incident
from tests.console.test_tenant_isolation import snapshot as snapshot_of
from tests.factories import inventory_doc, make_enrollment_token, make_fleet, small_topology

pytestmark = pytest.mark.django_db

# Nested far past Python's recursion limit, yet within the smallest route's body limit (64 KiB).
DEEP = b"[" * 30_000 + b"]" * 30_000


def snapshot(organization) -> dict:
    """The organization's rows, less the marks every authenticated request leaves (a node seen,
    a token used)."""
    volatile = ("last_seen", "last_used")
    return {label: [tuple(kv for kv in row if kv[0] not in volatile) for row in rows]
            for label, rows in snapshot_of(organization).items()}


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def _owner(world) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {world.token('alice')}")


def _agent(fleet) -> Client:
    """The node's agent, heard from once already (so the node is ready: a refused request
    changes nothing but the time it was last seen)."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}")
    assert client.post("/api/v1/agent/heartbeat", b"{}", content_type="application/json").status_code == 200
    return client


def _refused(response, field: str | None = None, status=(400,)):
    assert response.status_code in status, (response.status_code, response.content[:400])
    body = response.json()
    assert set(body) >= {"error", "detail"}, body
    if field is not None:
        assert field in body.get("fields", {}) or field in body["detail"], body
    return body


def _send(client, method, path, body, content_type="application/json"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return getattr(client, method)(path, raw, content_type=content_type)


# --- the format suffix on every detail action -----------------------------------------------------


def _detail_actions():
    out = []
    for prefix, viewset, _ in router.registry:
        for action in viewset.get_extra_actions():
            if action.detail:
                out.append((prefix, action.url_path, sorted(action.mapping)[0]))
    return out


@pytest.mark.parametrize(("prefix", "url_path", "method"), _detail_actions(), ids=lambda v: str(v))
def test_the_json_format_suffix_works_on_every_detail_action(world, fleet, prefix, url_path, method):
    ids = {"clusters": fleet.cluster.pk, "nodes": fleet.node.pk, "commands": fleet.command.pk,
           "audits": fleet.audit.pk, "incidents": Incident.objects.get(cluster=fleet.cluster).pk}
    assert prefix in ids, f"teach this test an object of /{prefix}/"
    query = "?src=acme-node0/nic0&dst=acme-node1/nic0" if url_path == "paths" else ""
    response = getattr(_owner(world), method)(f"/api/v1/{prefix}/{ids[prefix]}/{url_path}.json{query}")
    assert response.status_code < 500, (response.status_code, response.content[:300])
    assert response.status_code not in (404, 405)


def test_the_router_keeps_format_suffixes():
    assert isinstance(router, DefaultRouter) and router.include_format_suffixes
    assert get_resolver()  # the URLconf loads


# --- query parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize("since", ["2026-01-01T00:00:00+25:00", "2026-02-30T00:00:00Z", "9999-12-31T23:59:59-23:59"])
def test_an_impossible_time_in_since_names_the_parameter(world, fleet, since):
    _refused(_owner(world).get("/api/v1/telemetry/", {"since": since}), "since")


@pytest.mark.parametrize(("path", "ordering"), [
    ("/api/v1/nodes/", "health"), ("/api/v1/nodes/", "-name,health"), ("/api/v1/clusters/", "nodes"),
    ("/api/v1/members/", "user"), ("/api/v1/links/", "a"), ("/api/v1/gpus/", "node_name"),
    ("/api/v1/telemetry/", "no_such_field"), ("/api/v1/members/", "organization__memberships__user__password"),
    ("/api/v1/tokens/", "user__get_username"),
])
def test_ordering_by_a_field_that_is_not_a_column_names_the_parameter(world, fleet, path, ordering):
    _refused(_owner(world).get(path, {"ordering": ordering}), "ordering")
    column = "name" if path in ("/api/v1/nodes/", "/api/v1/clusters/") else "id"
    assert _owner(world).get(path, {"ordering": f"-{column}"}).status_code == 200


@pytest.mark.parametrize(("path", "name"), [
    ("/api/v1/probe-windows/", "network_ok"), ("/api/v1/incidents/", "network_ok"),
    ("/api/v1/clock-syncs/", "running"), ("/api/v1/clock-pairs/", "flagged"),
])
@pytest.mark.parametrize("value", ["-8035", "maybe", "yes"])
def test_a_boolean_filter_takes_true_or_false_and_names_anything_else(world, fleet, path, name, value):
    _refused(_owner(world).get(path, {name: value}), name)
    assert _owner(world).get(path, {name: "true"}).status_code == 200
    assert _owner(world).get(path, {name: "false"}).status_code == 200


# --- clusters ------------------------------------------------------------------------------------


def test_two_clusters_of_one_name_without_organization_is_a_conflict(world):
    owner = _owner(world)
    assert _send(owner, "post", "/api/v1/clusters/", {"name": "prod"}).status_code == 201
    _refused(_send(owner, "post", "/api/v1/clusters/", {"name": "prod"}), "name", status=(409,))


def test_paths_on_a_cluster_with_spaces_in_its_name_and_no_topology(world):
    owner = _owner(world)
    cluster = _send(owner, "post", "/api/v1/clusters/", {"name": "has spaces"}).json()
    response = owner.get(f"/api/v1/clusters/{cluster['id']}/paths/", {"src": "a/nic0", "dst": "b/nic0"})
    _refused(response, "src", status=(400, 404))


# --- JSON bodies: depth, NaN, NUL, surrogates -----------------------------------------------------

REST_BODIES = [("post", "/api/v1/clusters/"), ("put", "/api/v1/clusters/{cluster}/topology/"),
               ("post", "/api/v1/nodes/{node}/commands/"), ("post", "/api/v1/tokens/")]
AGENT_BODIES = [("post", "/api/v1/agent/heartbeat"), ("post", "/api/v1/agent/telemetry"),
                ("put", "/api/v1/agent/inventory"), ("post", "/api/v1/agent/commands/{command}/result")]


def _path(template, fleet):
    return template.format(cluster=fleet.cluster.pk, node=fleet.node.pk, command=fleet.command.pk)


@pytest.mark.parametrize(("method", "path"), REST_BODIES + AGENT_BODIES + [("post", "/api/v1/agent/enroll")])
@pytest.mark.parametrize("raw", [DEEP, b'{"name": NaN}', b'{"name": "a\\u0000b"}', b'{"name": "\\ud800"}',
                                 b'{"name": 1' + b"0" * 5000 + b"}"],
                         ids=["deep", "nan", "nul", "surrogate", "huge-integer"])
def test_a_json_body_that_cannot_be_stored_is_refused(world, fleet, method, path, raw):
    client = _agent(fleet) if "/agent/" in path else _owner(world)
    before = snapshot(world.acme)
    response = _send(client, method, _path(path, fleet), raw)
    _refused(response, status=(400,))
    assert snapshot(world.acme) == before


def test_a_command_with_a_nul_or_a_lone_surrogate_in_its_arguments_is_refused(world, fleet):
    for bad in ("\x00", "\ud800"):
        body = json.dumps({"type": "node.health", "args": {"note": bad}}).encode()
        _refused(_send(_owner(world), "post", f"/api/v1/nodes/{fleet.node.pk}/commands/", body), "args")


# --- topology: the columns are the limits --------------------------------------------------------


def _topology_with(**change):
    """small_topology with values changed; a renamed host or switch is renamed where referenced."""
    doc = small_topology("h")
    for path, value in change.items():
        section, index, key = path.split(".")
        entry = doc[section][int(index)]
        old, entry[key] = entry.get(key), value
        if key == "name" and section in ("hosts", "switches"):
            for nic in doc["nics"]:
                nic["host"] = value if nic["host"] == old else nic["host"]
            for link in doc["links"]:
                link["a"], link["b"] = (value if end == old else end for end in (link["a"], link["b"]))
    return doc


@pytest.mark.parametrize(("change", "field"), [
    ({"hosts.0.name": "h" * 201}, "hosts[0].name"),
    ({"switches.0.tier": "t" * 51}, "switches[0].tier"),
    ({"switches.0.tier": "leaf\x00"}, "switches[0].tier"),
    ({"switches.0.name": "s" * 201}, "switches[0].name"),
    ({"links.0.id": "l" * 256}, "links[0].id"),
    ({"nics.0.rail": 2**40}, "nics[0].rail"),
])
def test_a_topology_value_longer_or_larger_than_its_column_is_refused(world, fleet, change, field):
    doc = _topology_with(**change)
    owner = _owner(world)
    before = snapshot(world.acme)
    _refused(_send(owner, "put", f"/api/v1/clusters/{fleet.cluster.pk}/topology/", doc), field)
    assert snapshot(world.acme) == before


def test_a_topology_name_longer_than_its_column_is_refused(world, fleet):
    doc = small_topology("h") | {"name": "n" * 201}
    _refused(_send(_owner(world), "put", f"/api/v1/clusters/{fleet.cluster.pk}/topology/", doc), "name")


# --- agent routes: the columns are the limits -----------------------------------------------------


@pytest.mark.parametrize(("body", "field"), [
    ({"seq": 2**63, "records": []}, "seq"),
    ({"seq": 5, "records": [{"kind": "test.sample", "ts": "2026-02-30T00:00:00Z", "data": {}}]}, "records[0].ts"),
    ({"seq": 5, "records": [{"kind": "test.sample", "ts": "2026-01-01T00:00:00+25:00", "data": {}}]},
     "records[0].ts"),
])
def test_a_telemetry_batch_out_of_range_is_refused(world, fleet, test_telemetry_kind, body, field):
    _refused(_send(_agent(fleet), "post", "/api/v1/agent/telemetry", body), field)


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d["gpus"][0].update(index=2**40), "gpus[0].index"),
    (lambda d: d["nics"][0].update(mtu=-1), "nics[0].mtu"),
    (lambda d: d["nics"][0].update(speed_mbps=2**63), "nics[0].speed_mbps"),
    (lambda d: d["nics"][0].update(numa_node=2**40), "nics[0].numa_node"),
    (lambda d: d["gpus"][0].update(memory_bytes=-5), "gpus[0].memory_bytes"),
    (lambda d: d["host"].update(hostname="h" * 256), "host.hostname"),
    (lambda d: d["host"].update(kernel="6.1\x00"), "host.kernel"),
    (lambda d: d.update(collected_at="2026-02-30T00:00:00Z"), "collected_at"),
], ids=["gpu-index", "mtu", "speed", "numa", "memory", "hostname", "nul-fact", "impossible-date"])
def test_an_inventory_value_that_does_not_fit_is_refused(world, fleet, change, field):
    doc = inventory_doc(fleet.node.name, fleet.node.machine_id)
    change(doc)
    agent = _agent(fleet)
    before = snapshot(world.acme)
    _refused(_send(agent, "put", "/api/v1/agent/inventory", doc), field)
    assert snapshot(world.acme) == before


@pytest.mark.parametrize(("body", "field"), [
    ({"agent_version": "v" * 51}, "agent_version"),
    ({"agent_version": "1.0\x00"}, "agent_version"),
    ({"uptime_s": 2**70}, "uptime_s"),
])
def test_a_heartbeat_value_that_does_not_fit_is_refused(world, fleet, body, field):
    _refused(_send(_agent(fleet), "post", "/api/v1/agent/heartbeat", body), field)


def test_a_command_result_that_cannot_be_stored_is_refused(world, fleet):
    body = {"status": "succeeded", "result": {"note": "a\x00b"}}
    _refused(_send(_agent(fleet), "post", f"/api/v1/agent/commands/{fleet.command.pk}/result", body), "result")


@pytest.mark.parametrize("hostname", ["h" * 201, "h" * 255])
def test_enrollment_with_a_hostname_longer_than_a_node_name_is_refused(world, fleet, hostname):
    token = make_enrollment_token(fleet.cluster)
    body = {"token": token, "host": {"hostname": hostname, "machine_id": "m-long"}}
    _refused(_send(Client(), "post", "/api/v1/agent/enroll", body), "host.hostname")


def test_enrollment_with_a_nul_in_a_fact_is_refused(world, fleet):
    token = make_enrollment_token(fleet.cluster)
    body = {"token": token, "host": {"hostname": "h-nul", "machine_id": "m-nul", "kernel": "6.1\x00"}}
    _refused(_send(Client(), "post", "/api/v1/agent/enroll", body), "host.kernel")


# --- routes, pagination, repeated parameters -------------------------------------------------------


def test_a_url_that_names_no_route_answers_the_error_shape(world):
    for path in ("/api/v1/clusters/1.5/", "/api/v1/no-such-thing/", "/api/v1/clusters/-1e-9/topology/"):
        _refused(_owner(world).get(path), status=(404,))
    assert Client().get("/no-such-page/").status_code == 404  # pages keep their own 404


@pytest.mark.parametrize("query", [{"limit": "x"}, {"limit": "0"}, {"limit": "1001"}, {"offset": "-1"},
                                   {"offset": "1.5"}])
def test_pagination_out_of_range_names_the_parameter(world, query):
    _refused(_owner(world).get("/api/v1/clusters/", query), next(iter(query)))


def test_a_parameter_given_twice_or_empty_names_it(world, fleet):
    owner = _owner(world)
    _refused(owner.get("/api/v1/nics/?kind="), "kind")
    _refused(owner.get("/api/v1/nodes/?cluster="), "cluster")
    for query in (f"cluster={fleet.cluster.pk}&cluster={fleet.cluster.pk}", "limit=5&limit=6", "ordering=name&ordering=-name"):
        _refused(owner.get(f"/api/v1/nodes/?{query}"), query.split("=")[0])
    assert owner.get("/api/v1/nodes/?state=ready&state=lost").status_code == 200  # a list filter takes several


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/api/v1/clusters/{cluster}/enrollment-tokens/", {"description": -682387}, "description"),
    ("/api/v1/clusters/{cluster}/enrollment-tokens/", {"max_uses": "5"}, "max_uses"),
    ("/api/v1/clusters/", {"name": 5}, "name"),
    ("/api/v1/clusters/", {"name": "typed", "organization": "1"}, "organization"),
    ("/api/v1/tokens/", {"name": "t", "scope": ["read"]}, "scope"),
    ("/api/v1/nodes/{node}/commands/", {"type": "node.health", "idempotency_key": True}, "idempotency_key"),
])
def test_a_value_of_the_wrong_json_type_is_refused_not_coerced(world, fleet, path, body, field):
    owner = _owner(world)
    before = snapshot(world.acme)
    _refused(_send(owner, "post", _path(path, fleet), body), field)
    assert snapshot(world.acme) == before
