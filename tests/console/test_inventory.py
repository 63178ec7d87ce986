from __future__ import annotations

import json

import pytest
from django.test import Client

from console.fleet.models import Gpu, Nic
from tests.factories import inventory_doc, make_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


def _put(fleet, doc):
    return Client(HTTP_AUTHORIZATION=f"Bearer {fleet.credential}").put(
        "/api/v1/agent/inventory", json.dumps(doc), content_type="application/json"
    )


def _eight_gpu_doc(fleet):
    doc = inventory_doc(fleet.node.name, fleet.node.machine_id, gpus=8)
    doc["nics"] = [
        {"device": f"nic{i}", "kind": "infiniband", "guid": f"0x946dae03007a1b{i:02x}", "pci_address": f"0000:{0x19 + i:02x}:00.0",
         "numa_node": i // 4, "speed_mbps": 400000, "mtu": 4092, "link_state": "up" if i != 5 else "down"}
        for i in range(8)
    ] + [{"device": "eno1", "kind": "ethernet", "mac": "3c:ec:ef:00:00:01", "link_state": "up", "addresses": ["10.1.0.5/16"]}]
    doc["affinity"] = [{"gpu": f"GPU-{fleet.node.machine_id}-{i}", "nic": f"nic{i}", "relation": "PIX"} for i in range(8)]
    doc["affinity"] += [{"gpu": f"GPU-{fleet.node.machine_id}-{i}", "nic": f"nic{(i + 1) % 8}", "relation": "NODE"}
                        for i in range(8)]
    return doc


def test_an_inventory_creates_gpus_and_nics_and_links_each_gpu_to_its_nearest_nic(fleet):
    response = _put(fleet, _eight_gpu_doc(fleet))
    assert response.status_code == 200 and response.json() == {"gpus": 8, "nics": 9}
    gpus = Gpu.objects.filter(node=fleet.node).order_by("index")
    assert [g.nearest_nic.device for g in gpus] == [f"nic{i}" for i in range(8)]
    assert gpus[3].affinity == [{"nic": "nic3", "relation": "PIX"}, {"nic": "nic4", "relation": "NODE"}]
    nics = {n.device: n for n in Nic.objects.filter(node=fleet.node)}
    assert nics["nic0"].in_topology and nics["nic0"].guid == "0x946dae03007a1b00"  # the declared NIC, completed
    assert nics["nic5"].health == "down" and nics["eno1"].in_topology is False
    assert fleet.node.__class__.objects.get(pk=fleet.node.pk).facts["kernel"] == "6.1.0"


def test_a_gpu_that_disappears_is_removed_and_a_declared_nic_that_disappears_is_marked_absent(fleet):
    _put(fleet, _eight_gpu_doc(fleet))
    doc = inventory_doc(fleet.node.name, fleet.node.machine_id, gpus=7)
    doc["nics"] = []
    doc["affinity"] = []
    assert _put(fleet, doc).status_code == 200
    assert Gpu.objects.filter(node=fleet.node).count() == 7
    declared = Nic.objects.get(node=fleet.node, device="nic0")
    assert declared.link_state == "absent" and declared.health == "down"
    assert not Nic.objects.filter(node=fleet.node, device="eno1").exists()


def test_a_node_without_gpus_reports_none(fleet):
    doc = inventory_doc(fleet.node.name, fleet.node.machine_id, gpus=0)
    doc["errors"] = ["nvml: NVML Shared Library Not Found"]
    assert _put(fleet, doc).json()["gpus"] == 0
    assert not Gpu.objects.filter(node=fleet.node).exists()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(format="nope"), "format"),
        (lambda d: d["gpus"].append({"index": 0}), "gpus[1].index"),
        (lambda d: d["gpus"][0].update(memory_bytes="lots"), "gpus[0].memory_bytes"),
        (lambda d: d["nics"][0].pop("device"), "nics[0].device"),
        (lambda d: d["nics"][0].update(mtu="9000"), "nics[0].mtu"),
        (lambda d: d["affinity"][0].update(relation="NEAR"), "affinity[0].relation"),
    ],
)
def test_a_malformed_inventory_names_the_field_and_stores_nothing(fleet, mutate, field):
    doc = inventory_doc(fleet.node.name, fleet.node.machine_id, gpus=1)
    mutate(doc)
    before = list(Gpu.objects.filter(node=fleet.node).values())
    response = _put(fleet, doc)
    assert response.status_code == 400
    assert list(response.json()["fields"]) == [field]
    assert list(Gpu.objects.filter(node=fleet.node).values()) == before
