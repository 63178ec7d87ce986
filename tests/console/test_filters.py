import pytest

from console.fleet import services as fleet_services
from console.fleet.models import Node
from tests.factories import make_fleet

pytestmark = pytest.mark.django_db


def test_lists_filter_by_state_cluster_and_topology_and_paginate(world):
    fleet = make_fleet(world.acme)
    fleet_services.mark_seen(fleet.node)
    client = world.client("bob", scope="read")
    ready = client.get("/api/v1/nodes/", {"state": "ready"}).json()
    assert [n["name"] for n in ready["results"]] == [fleet.node.name]
    enrolling = client.get("/api/v1/nodes/", {"state": "enrolling", "cluster": fleet.cluster.pk}).json()
    assert {n["name"] for n in enrolling["results"]} == set(
        Node.objects.filter(cluster=fleet.cluster, state="enrolling").values_list("name", flat=True)
    )
    rail0 = client.get("/api/v1/nics/", {"rail": 0, "in_topology": "true"}).json()
    assert rail0["count"] == 2 and all(n["rail"] == 0 for n in rail0["results"])
    page = client.get("/api/v1/links/", {"limit": 1}).json()
    assert page["count"] == 3 and len(page["results"]) == 1 and "offset=1" in page["next"]
    bad = client.get("/api/v1/nodes/", {"state": "sleeping"})
    assert bad.status_code == 400 and "state" in bad.json()["fields"]
