"""Fleet agreement: host facts that differ from the fleet's majority are named, with both values."""

from __future__ import annotations

import copy

from workers.audit.fleet import CODE, agreement

BASE = {
    "hostname": "n", "kernel": "5.15.0-1042-nvidia", "os": "Ubuntu 22.04.4 LTS", "gpu_driver": "565.57.01",
    "cuda_driver": "12.7", "cuda_toolkit": "12.6.2", "nccl": ["2.23.4"], "nic_drivers": ["mlx5_core 24.10-1.1.4"],
    "nic_firmware": ["28.42.1000"], "gpu_models": ["NVIDIA H100 80GB HBM3"], "gpu_count": 8, "hugepages_total": 0,
    "hugepage_size_kb": 2048, "transparent_hugepages": "madvise", "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
    "cpu_count": 224, "memory_bytes": 2164110462976,
}


def fleet(n: int) -> dict[str, dict]:
    return {f"node{i:04d}": copy.deepcopy(BASE) | {"hostname": f"node{i:04d}"} for i in range(n)}


def test_a_uniform_fleet_agrees():
    report = agreement(fleet(8))
    assert report["status"] == "pass" and report["outliers"] == [] and report["unknown"] == []
    assert all(k["state"] == "agree" for k in report["keys"])


def test_outliers_are_named_with_their_value_and_the_reference():
    nodes = fleet(8)
    nodes["node0003"]["nccl"] = ["2.19.3"]
    nodes["node0005"]["gpu_driver"] = "550.54.15"
    nodes["node0005"]["nic_firmware"] = ["28.39.1002", "28.42.1000"]  # one NIC behind
    nodes["node0006"]["memory_bytes"] = int(BASE["memory_bytes"] * 0.995)  # within 2%: agrees
    nodes["node0007"]["memory_bytes"] = int(BASE["memory_bytes"] * 0.75)  # a DIMM missing
    report = agreement(nodes)
    got = {(o["node"], o["key"], o["status"]): (o["value"], o["reference"]) for o in report["outliers"]}
    assert got == {
        ("node0003", "nccl", "fail"): (["2.19.3"], ["2.23.4"]),
        ("node0005", "gpu_driver", "fail"): ("550.54.15", "565.57.01"),
        ("node0005", "nic_firmware", "fail"): (["28.39.1002", "28.42.1000"], ["28.42.1000"]),
        ("node0007", "memory_bytes", "warn"): (int(BASE["memory_bytes"] * 0.75), BASE["memory_bytes"]),
    }
    assert report["status"] == "fail" and all(o["code"] == CODE for o in report["outliers"])
    nccl = next(o for o in report["outliers"] if o["key"] == "nccl")
    assert "7 of 8 nodes" in nccl["message"] and "2.23.4" in nccl["message"]


def test_a_split_fleet_is_not_resolved_by_guessing():
    nodes = fleet(4)
    nodes["node0002"]["kernel"] = nodes["node0003"]["kernel"] = "6.5.0-1019-nvidia"
    report = agreement(nodes)
    kernel = next(k for k in report["keys"] if k["key"] == "kernel")
    assert kernel["state"] == "split" and kernel["reference"] is None
    assert [g["nodes"] for g in kernel["groups"]] == [["node0000", "node0001"], ["node0002", "node0003"]]
    split = [o for o in report["outliers"] if o["key"] == "kernel"]
    assert len(split) == 1 and split[0]["node"] is None and "no majority" in split[0]["message"]
    assert report["status"] == "fail"


def test_a_node_that_did_not_report_a_fact_is_unknown_not_agreeing():
    nodes = fleet(3)
    del nodes["node0001"]["nccl"]
    nodes["node0002"]["gpu_driver"] = None
    report = agreement(nodes)
    assert report["unknown"] == ["node0001", "node0002"]
    assert report["status"] == "warn" and report["outliers"] == []
    nccl = next(k for k in report["keys"] if k["key"] == "nccl")
    assert nccl["unknown"] == ["node0001"] and nccl["state"] == "agree"


def test_list_order_does_not_matter():
    nodes = fleet(3)
    nodes["node0001"]["nic_firmware"] = ["28.42.1000", "28.39.1002"]
    nodes["node0002"]["nic_firmware"] = ["28.39.1002", "28.42.1000"]
    report = agreement(nodes)
    fw = next(k for k in report["keys"] if k["key"] == "nic_firmware")
    assert fw["state"] == "outliers" and list(fw["outliers"]) == ["node0000"]
