"""Topology import/export: the public examples round-trip, bad documents change nothing."""

from __future__ import annotations

import copy
import glob
import json
import os

import pytest
from django.core.management import CommandError, call_command

from console.fleet.models import Cluster, Link, Nic, Node, Switch
from console.fleet.topology_io import export_topology, import_topology
from tests.conftest import SCENARIOS_DIR
from tests.factories import make_enrollment_token

pytestmark = pytest.mark.django_db
EXAMPLES = sorted(glob.glob(os.path.join(SCENARIOS_DIR, "*", "topology.json")))


@pytest.fixture
def cluster(world):
    return Cluster.objects.create(organization=world.acme, name="fabric")


def _counts(cluster):
    return tuple(m.objects.filter(cluster=cluster).count() for m in (Node, Switch, Nic, Link))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: os.path.basename(os.path.dirname(p)))
def test_the_public_examples_import_and_export_unchanged_through_the_api(world, cluster, path):
    with open(path) as fh:
        document = json.load(fh)
    client = world.client("carol")
    response = client.put(f"/api/v1/clusters/{cluster.pk}/topology/", document, format="json")
    assert response.status_code == 200, response.content[:300]
    assert response.json()["created"] == {"hosts": 32, "switches": 36, "nics": 256, "links": 384}
    assert client.get(f"/api/v1/clusters/{cluster.pk}/topology/").json() == document


def test_re_importing_keeps_ids_and_reports_nothing_changed(cluster, topology_doc):
    import_topology(cluster, topology_doc)
    ids = sorted(Link.objects.filter(cluster=cluster).values_list("pk", flat=True))
    summary = import_topology(cluster, topology_doc)
    assert summary.created == summary.deleted == {"hosts": 0, "switches": 0, "nics": 0, "links": 0}
    assert sorted(Link.objects.filter(cluster=cluster).values_list("pk", flat=True)) == ids


def test_a_smaller_topology_removes_what_it_no_longer_names_but_keeps_enrolled_nodes(cluster, topology_doc):
    import_topology(cluster, topology_doc)
    from console.fleet.services import enroll

    enroll(make_enrollment_token(cluster), {"hostname": "node3", "machine_id": "m3"})
    smaller = copy.deepcopy(topology_doc)
    smaller["hosts"] = [h for h in smaller["hosts"] if h["name"] not in ("node2", "node3")]
    smaller["nics"] = [n for n in smaller["nics"] if n["host"] not in ("node2", "node3")]
    smaller["links"] = [lk for lk in smaller["links"] if not lk["a"].startswith(("node2/", "node3/"))]
    summary = import_topology(cluster, smaller)
    assert summary.deleted["hosts"] == 1 and summary.deleted["links"] == 4
    assert not Node.objects.filter(cluster=cluster, name="node2").exists()
    kept = Node.objects.get(cluster=cluster, name="node3")
    assert kept.in_topology is False  # enrolled: it stays, undeclared
    assert export_topology(cluster) == smaller


def _broken(topology_doc, mutate):
    doc = copy.deepcopy(topology_doc)
    mutate(doc)
    return doc


INVALID = {
    "wrong format": (lambda d: d.update(format="lockstep.topology/v0"), "format: expected 'lockstep.topology/v1'"),
    "missing section": (lambda d: d.pop("links"), "missing required key 'links'"),
    "missing key": (lambda d: d["nics"][1].pop("host"), "nics[1]: missing required key 'host'"),
    "duplicate host": (lambda d: d["hosts"].append({"name": "node0"}), "hosts[4].name: duplicate name 'node0'"),
    "duplicate link id": (lambda d: d["links"].append(dict(d["links"][0])), "duplicate link id"),
    "unknown host": (lambda d: d["nics"][0].update(host="node99"), "nics[0].host: 'node99' is not a defined host"),
    "unknown endpoint": (lambda d: d["links"][0].update(b="leaf-x"), "links[0].b: 'leaf-x' is not a NIC or switch"),
    "host as endpoint": (lambda d: d["links"][0].update(a="node0"), "links[0].a: 'node0' is a host"),
    "name with space": (lambda d: d["switches"][0].update(name="leaf 0"), "switches[0].name: 'leaf 0' is not a name"),
    "bad rail": (lambda d: d["nics"][0].update(rail=-1), "nics[0].rail: -1 is not a non-negative integer"),
    "not a list": (lambda d: d.update(hosts={"name": "x"}), "hosts: must be a list"),
    "switch and nic share a name": (lambda d: d["switches"].append({"name": "node1/nic0", "tier": "leaf"}),
                                    "duplicate name 'node1/nic0'"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_each_kind_of_invalid_document_is_refused_naming_the_problem_and_nothing_changes(world, cluster, topology_doc,
                                                                                           case):
    import_topology(cluster, topology_doc)
    before = (_counts(cluster), export_topology(cluster))
    mutate, message = INVALID[case]
    response = world.client("carol").put(f"/api/v1/clusters/{cluster.pk}/topology/",
                                         _broken(topology_doc, mutate), format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid" and "nothing changed" in body["detail"]
    assert any(message in f"{field}: {problem}" for field, problem in body["fields"].items()), body["fields"]
    assert (_counts(cluster), export_topology(cluster)) == before


def test_every_problem_is_listed_at_once(world, cluster, topology_doc):
    doc = _broken(topology_doc, lambda d: (d["nics"][0].update(host="ghost"), d["links"][1].update(a="nowhere")))
    body = world.client("carol").put(f"/api/v1/clusters/{cluster.pk}/topology/", doc, format="json").json()
    assert set(body["fields"]) == {"nics[0].host", "links[1].a"}, body["fields"]


def test_a_document_that_is_not_an_object_is_refused(world, cluster):
    response = world.client("carol").put(f"/api/v1/clusters/{cluster.pk}/topology/", [1, 2], format="json")
    assert response.status_code == 400
    assert "must be a JSON object" in response.json()["detail"]


def test_the_management_commands_import_and_export(cluster, tmp_path, capsys):
    path = EXAMPLES[0]
    call_command("import_topology", str(cluster.pk), path)
    call_command("export_topology", str(cluster.pk))
    exported = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    with open(path) as fh:
        assert exported == json.load(fh)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "lockstep.topology/v1", "hosts": []')
    with pytest.raises(CommandError, match="is not JSON: line 1"):
        call_command("import_topology", str(cluster.pk), str(bad))
    bad.write_text(json.dumps({"format": "lockstep.topology/v1", "hosts": [], "switches": [], "nics": [],
                               "links": [{"id": "L", "a": "x", "b": "y"}]}))
    with pytest.raises(CommandError, match="nothing changed"):
        call_command("import_topology", str(cluster.pk), str(bad))
    assert Link.objects.filter(cluster=cluster).count() == 384


def test_nics_an_agent_reported_are_adopted_by_the_topology(cluster, topology_doc):
    from console.fleet.services import apply_inventory, enroll
    from tests.factories import inventory_doc

    enrolled = enroll(make_enrollment_token(cluster), {"hostname": "node0", "machine_id": "m0"})
    apply_inventory(enrolled.node, inventory_doc("node0", "m0"))
    reported = Nic.objects.get(node=enrolled.node, device="nic0")
    assert reported.in_topology is False
    import_topology(cluster, topology_doc)
    adopted = Nic.objects.get(pk=reported.pk)
    assert adopted.in_topology and adopted.name == "node0/nic0" and adopted.mac == "02:00:00:00:00:01"


def test_the_api_lists_the_ecmp_paths_between_two_nics(world, cluster, topology_doc):
    import_topology(cluster, topology_doc)
    client = world.client("bob", scope="read")
    url = f"/api/v1/clusters/{cluster.pk}/paths/"
    # node0 and node2 are on different leaves of rail 0: two spines, two paths of four links.
    body = client.get(url, {"src": "node0/nic0", "dst": "node2/nic0"}).json()
    assert body["hops"] == 4 and body["count"] == 2 and not body["truncated"]
    assert sorted(body["paths"]) == [
        ["node0/nic0~leaf-r0-0", f"leaf-r0-0~spine-{s}#0", f"leaf-r0-1~spine-{s}#0", "node2/nic0~leaf-r0-1"]
        for s in (0, 1)
    ]
    same_leaf = client.get(url, {"src": "node0/nic0", "dst": "node1/nic0", "limit": 1}).json()
    assert same_leaf["hops"] == 2 and same_leaf["count"] == 1
    truncated = client.get(url, {"src": "node0/nic0", "dst": "node2/nic0", "limit": 1}).json()
    assert len(truncated["paths"]) == 1 and truncated["truncated"]
    unknown = client.get(url, {"src": "node0/nic0", "dst": "node9/nic0"})
    assert unknown.status_code == 400 and "node9/nic0" in unknown.json()["fields"]["dst"]
    same = client.get(url, {"src": "node0/nic0", "dst": "node0/nic0"})
    assert same.status_code == 400 and same.json()["fields"] == {"dst": "the same NIC as src"}
