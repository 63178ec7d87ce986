"""Inventory discovery against recorded GPU servers (sysfs trees + NVML fake) and this machine."""

from __future__ import annotations

import ctypes.util
import filecmp
import json
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from agent_testlib import DATA, PYTHON, REPO, subprocess_env
from fakes import nvml_fake
from fakes.nvml_fake import FakeGpu, FakeNvml

from agent.inventory import FORMAT, HostPaths, collect
from agent.inventory.addresses import from_ip_json, from_netlink
from agent.inventory.pcie import normalize_bus_id, relation

H100_UUIDS = [g["uuid"] for g in nvml_fake._H100_RECORD]


def tree(name: str) -> HostPaths:
    return HostPaths.from_sysfs_root(DATA / name / "sys")


def by_device(doc: dict) -> dict[str, dict]:
    return {n["device"]: n for n in doc["nics"]}


# -- DGX H100 ------------------------------------------------------------------------------


DGX_RAILS = ["ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"]
DGX_RDMA = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
DGX_NIC_BUSES = ["18", "40", "4f", "5e", "9a", "c0", "ce", "dc"]
DGX_GPU_BUSES = ["1b", "43", "52", "61", "9d", "c3", "d1", "df"]


def test_dgx_h100_gpus_nics_and_pxb_affinity():
    fake = FakeNvml.dgx_h100()
    doc = collect(tree("dgx-h100"), nvml=fake)

    assert doc["format"] == FORMAT
    assert doc["errors"] == []
    assert doc["host"] == {
        "hostname": "dgx-h100-01",
        "machine_id": "8c2d1f4e9b7a46c1a0f35e2b7d9c4a18",
        "boot_id": "6b0d5c8e-2f4a-4e1b-9a7c-3d5e8f1a2b4c",
        "kernel": "5.15.0-1042-nvidia",
        "os": "Ubuntu 22.04.4 LTS",
        "arch": "x86_64",
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480C",
        "cpu_count": 224,
        "memory_bytes": 2113389124 * 1024,
    }

    gpus = doc["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["uuid"] for g in gpus] == H100_UUIDS
    assert [g["pci_bus_id"] for g in gpus] == [f"0000:{b}:00.0" for b in DGX_GPU_BUSES]
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    for g in gpus:
        assert g["name"] == "NVIDIA H100 80GB HBM3"
        assert g["memory_bytes"] == 81559 * 1024 * 1024 == 85520809984
        assert (g["driver_version"], g["cuda_version"], g["ecc_enabled"]) == ("565.57.01", "12.7", True)
        assert g["nvlinks"] == [{"link": i, "active": True} for i in range(18)]

    nics = by_device(doc)
    assert set(nics) == set(DGX_RAILS) | {"ibp41s0f0", "enp41s0f1np1", "ibp170s0f0", "enp170s0f1np1", "docker0"}
    assert "veth3f2a1b0" not in nics and "lo" not in nics  # container plumbing and loopback are left out
    for i, name in enumerate(DGX_RAILS):
        nic = nics[name]
        assert nic["kind"] == "infiniband"
        assert nic["rdma_device"] == DGX_RDMA[i]
        assert nic["pci_address"] == f"0000:{DGX_NIC_BUSES[i]}:00.0"
        assert nic["numa_node"] == (0 if i < 4 else 1)
        assert (nic["speed_mbps"], nic["mtu"], nic["link_state"]) == (400000, 4092, "up")
        assert nic["mac"] == "" and nic["guid"].startswith("0x946dae03")
        assert nic["addresses"] == [f"192.168.{10 + i}.21/24"]
    assert nics["enp41s0f1np1"]["kind"] == "ethernet"
    assert nics["enp41s0f1np1"]["link_state"] == "down" and nics["enp41s0f1np1"]["speed_mbps"] is None
    assert nics["enp41s0f1np1"]["pci_address"] == "0000:29:00.1"
    assert nics["ibp170s0f0"]["link_state"] == "down"
    assert nics["docker0"]["pci_address"] == "" and nics["docker0"]["numa_node"] is None

    # nvidia-smi topo -m on a DGX H100: each GPU is PXB to its own ConnectX-7, NODE to the
    # other NICs of its socket, SYS across sockets (SYS pairs are not listed).
    close = {(a["gpu"], a["nic"]): a["relation"] for a in doc["affinity"]}
    pxb = sorted((a["gpu"], a["nic"]) for a in doc["affinity"] if a["relation"] == "PXB")
    assert pxb == sorted(zip(H100_UUIDS, DGX_RAILS, strict=True))
    assert Counter(close.values()) == {"PXB": 8, "NODE": 40}
    assert close[(H100_UUIDS[0], "ibp64s0")] == "NODE"
    assert close[(H100_UUIDS[0], "ibp41s0f0")] == "NODE"
    assert (H100_UUIDS[0], "ibp154s0") not in close  # SYS
    assert fake.calls.count("nvmlInit") == fake.calls.count("nvmlShutdown") == 1


# -- HGX H100 with PCIe switches -------------------------------------------------------------


HGX_RAILS = ["enp25s0np0", "enp41s0np0", "enp59s0np0", "enp92s0np0",
             "enp155s0np0", "enp170s0np0", "enp187s0np0", "enp218s0np0"]


def test_hgx_h100_each_gpu_has_a_pix_nic():
    doc = collect(tree("hgx-h100"), nvml=FakeNvml.hgx_h100())
    assert doc["errors"] == []
    assert [g["pci_bus_id"] for g in doc["gpus"]] == [
        "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
    ]
    pix = {a["gpu"]: a["nic"] for a in doc["affinity"] if a["relation"] == "PIX"}
    assert pix == dict(zip(H100_UUIDS, HGX_RAILS, strict=True))
    assert Counter(a["relation"] for a in doc["affinity"]) == {"PIX": 8, "NODE": 40}

    nics = by_device(doc)
    assert "bond0" not in nics  # virtual and down
    rail = nics["enp25s0np0"]
    assert rail == {
        "device": "enp25s0np0", "kind": "ethernet", "mac": "a0:88:c2:47:1a:00", "guid": "0xa088c20300471a00",
        "rdma_device": "mlx5_0", "pci_address": "0000:19:00.0", "numa_node": 0, "speed_mbps": 400000,
        "mtu": 4200, "link_state": "up", "addresses": ["10.99.91.59/24"],
    }
    assert nics["enp73s0f0np0"]["addresses"] == ["10.20.0.59/16", "fe80::a288:c2ff:fe48:1a10/64"]
    assert nics["enp200s0f1np1"]["link_state"] == "down" and nics["enp200s0f1np1"]["speed_mbps"] is None


# -- NVML behaviour ----------------------------------------------------------------------------


def test_pcie_card_without_nvlink_reports_no_links_and_no_error():
    doc = collect(HostPaths(), nvml=FakeNvml.l40s())
    (gpu,) = doc["gpus"]
    assert gpu["name"] == "NVIDIA L40S" and gpu["nvlinks"] == []
    assert gpu["ecc_enabled"] is True and gpu["memory_bytes"] == 46068 * 1024 * 1024
    assert gpu["cuda_version"] == "12.4" and gpu["pci_bus_id"] == "0000:a1:00.0"
    assert not [e for e in doc["errors"] if e.startswith("nvml")]


def test_no_library_no_driver_and_a_lost_gpu():
    doc = collect(tree("hgx-h100"), nvml=FakeNvml.without_library())
    assert doc["gpus"] == [] and doc["affinity"] == []
    assert doc["errors"] == ["nvml: NVML Shared Library Not Found"]
    assert len(doc["nics"]) == 12  # the rest of the inventory still works

    doc = collect(tree("hgx-h100"), nvml=FakeNvml.without_driver())
    assert doc["errors"] == ["nvml: Driver Not Loaded"]

    fake = FakeNvml.hgx_h100()
    fake.gpus[3].lost = True
    fake.gpus[5].ecc = None  # a GPU without ECC: not an error, ecc_enabled is null
    doc = collect(tree("hgx-h100"), nvml=fake)
    assert len(doc["gpus"]) == 8
    assert doc["gpus"][5]["ecc_enabled"] is None
    lost = doc["gpus"][3]
    assert lost["uuid"] == "" and lost["pci_bus_id"] == ""
    assert any("GPU 3" in e and "GPU is lost" in e for e in doc["errors"])
    assert all("GPU 3" in e for e in doc["errors"])
    assert fake.calls.count("nvmlInit") == fake.calls.count("nvmlShutdown")


def test_nvml_fake_behaves_like_pynvml():
    pynvml = pytest.importorskip("pynvml")
    fake = FakeNvml.hgx_h100()
    with pytest.raises(fake.NVMLError) as info:
        fake.nvmlDeviceGetCount()
    assert isinstance(info.value, fake.NVMLError_Uninitialized)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(8)
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetNvLinkState(handle, 18)
    assert fake.nvmlDeviceGetNvLinkState(handle, 17) == pynvml.NVML_FEATURE_ENABLED
    assert fake.nvmlDeviceGetPciInfo(handle).busId == "00000000:18:00.0"
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlShutdown()
    # same codes, class names and messages as the real module
    for name in dir(nvml_fake):
        if name.startswith("NVML_ERROR_") or name.startswith("NVMLError_") or name in (
            "NVML_FEATURE_ENABLED", "NVML_NVLINK_MAX_LINKS", "NVML_TEMPERATURE_GPU",
            "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
        ):
            assert hasattr(pynvml, name), name
            if name.startswith("NVML_"):
                assert getattr(pynvml, name) == getattr(nvml_fake, name), name
    for code in (3, 9, 12, 15):
        assert str(pynvml.NVMLError(code)) == str(nvml_fake.NVMLError(code))
        assert type(pynvml.NVMLError(code)).__name__ == type(nvml_fake.NVMLError(code)).__name__


# -- this machine --------------------------------------------------------------------------------


def _libnvml_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_libnvml_present(), reason="this machine has libnvidia-ml; the no-GPU path needs a host without")
def test_this_machine_real_pynvml_no_gpu():
    doc = collect()  # real /sys, real pynvml (or none)
    assert doc["gpus"] == [] and doc["affinity"] == []
    nvml_errors = [e for e in doc["errors"] if e.startswith("nvml")]
    assert nvml_errors in (["nvml: NVML Shared Library Not Found"],
                           ["nvml: the nvidia-ml-py package (pynvml) is not installed"])
    host = doc["host"]
    assert host["hostname"] == socket.gethostname()
    assert host["machine_id"] == Path("/etc/machine-id").read_text().strip()
    assert host["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert host["kernel"] == os.uname().release and host["arch"] == os.uname().machine
    assert host["cpu_count"] == os.cpu_count() and host["memory_bytes"] > 0
    backed = sorted(p.name for p in Path("/sys/class/net").iterdir() if (p / "device").exists())
    assert backed, "this machine should have at least one device-backed NIC"
    reported = by_device(doc)
    assert set(backed) <= set(reported)
    for name in backed:
        assert reported[name]["mac"] == Path(f"/sys/class/net/{name}/address").read_text().strip()
        assert reported[name]["pci_address"]  # virtio or PCI NICs sit below a PCI function
    assert "lo" not in reported


def test_netlink_addresses_equal_ip_json():
    if not shutil.which("ip"):
        pytest.skip("iproute2 is not installed")
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    assert from_netlink() == from_ip_json(out)


def test_cli_inventory_against_a_recorded_tree(tmp_path):
    config = tmp_path / "agent.env"
    config.write_text("")
    proc = subprocess.run(
        [PYTHON, "-m", "agent", "inventory", "--sysfs-root", str(DATA / "dgx-h100" / "sys"), "--config", str(config)],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["format"] == FORMAT and doc["host"]["hostname"] == "dgx-h100-01"
    assert set(by_device(doc)) >= set(DGX_RAILS)
    bad = subprocess.run([PYTHON, "-m", "agent", "inventory", "--sysfs-root", str(tmp_path / "nope"),
                          "--config", str(config)], cwd=REPO, env=subprocess_env(), capture_output=True, text=True)
    assert bad.returncode == 2 and "--sysfs-root" in bad.stderr


def test_recorded_trees_are_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(DATA / "build_trees.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    for name in ("dgx-h100", "hgx-h100"):
        _assert_same_tree(DATA / name, tmp_path / name)


def _assert_same_tree(a: Path, b: Path) -> None:
    def listing(root: Path) -> dict[str, str]:
        out = {}
        for dirpath, dirnames, filenames in os.walk(root):
            for entry in dirnames + filenames:
                p = Path(dirpath) / entry
                rel = str(p.relative_to(root))
                out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else ("dir" if p.is_dir() else "file")
        return out

    la, lb = listing(a), listing(b)
    assert la == lb
    for rel, kind in la.items():
        if kind == "file":
            assert filecmp.cmp(a / rel, b / rel, shallow=False), rel


# -- the relation rules -------------------------------------------------------------------------


def test_relation_rules():
    hb, rp, usp = "pci0000:15", "0000:15:01.0", "0000:16:00.0"
    gpu = [hb, rp, usp, "0000:17:00.0", "0000:18:00.0"]
    nic_same_switch = [hb, rp, usp, "0000:17:01.0", "0000:19:00.0"]
    nic_behind_second_switch = [hb, rp, usp, "0000:17:02.0", "0000:1a:00.0", "0000:1b:00.0", "0000:1c:00.0"]
    nic_other_root_port = [hb, "0000:15:03.0", "0000:20:00.0"]
    nic_other_bridge = ["pci0000:37", "0000:37:01.0", "0000:38:00.0"]
    assert relation(gpu, 0, nic_same_switch, 0) == "PIX"
    assert relation(gpu, 0, nic_behind_second_switch, 0) == "PXB"
    assert relation(gpu, 0, nic_other_root_port, 0) == "PHB"
    assert relation(gpu, 0, nic_other_bridge, 0) == "NODE"
    assert relation(gpu, 0, nic_other_bridge, 1) == "SYS"
    assert relation(gpu, None, nic_other_bridge, None) == "NODE"  # unknown NUMA: one node
    port0 = ["pci0000:28", "0000:28:01.0", "0000:29:00.0"]
    port1 = ["pci0000:28", "0000:28:01.0", "0000:29:00.1"]
    assert relation(port0, 0, port1, 0) == "PIX"  # two functions of one card
    assert normalize_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_bus_id(b"0000:DB:00.0") == "0000:db:00.0"


def test_fake_gpu_list_matches_recorded_smi():
    # the recorded H100 values the fake serves, spot-checked against the nvidia-smi -q record
    fake = FakeNvml.hgx_h100()
    assert len(fake.gpus) == 8 and all(isinstance(g, FakeGpu) for g in fake.gpus)
    assert fake.gpus[0].uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert fake.gpus[7].bus_id == "00000000:DB:00.0" and fake.gpus[0].power_mw == 100890
