"""Node checks of the audit against recorded trees and the NVML fake: healthy passes, each defect
fails with its code, on the component it is on."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from agent_testlib import DATA
from fakes import nvml_fake
from fakes.nvml_fake import DEFECTS, HGX_H100_DEFECTS, FakeNvml
from test_agent_inventory import _assert_same_tree

from agent.audit import collect, node
from agent.audit import gpu as gpu_checks
from agent.audit import host as host_checks
from agent.audit import nic as nic_checks
from agent.audit import pcie as pcie_checks
from agent.audit.results import Result, worst
from agent.audit.thresholds import GENERIC, PROFILES, SOURCES, profile_for
from agent.audit.xid import bus_of, parse_kernel_log
from agent.commands import ArgError, CommandContext, default_registry, load_modules, validate_args
from agent.inventory import HostPaths

HGX_RAILS = ["enp25s0np0", "enp41s0np0", "enp59s0np0", "enp92s0np0", "enp155s0np0", "enp170s0np0", "enp187s0np0",
             "enp218s0np0"]
DGX_RAILS = ["ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0", "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0"]


def tree(name: str) -> HostPaths:
    return HostPaths.from_sysfs_root(DATA / name / "sys")


def fabric_args(rails: list[str], mtu: int) -> dict:
    return {"nics": [{"device": d, "rail": i} for i, d in enumerate(rails)], "mtu": mtu,
            "rails": [{"rail": i, "nic": d} for i, d in enumerate(rails)], "listen_ms": 50}


def failures(report: dict) -> list[tuple[str, str, str]]:
    return sorted((f["component"]["name"], f["status"], f["code"]) for f in report["failures"])


def codes_of(report: dict, name: str) -> set[str]:
    return {f["code"] for f in report["failures"] if f["component"]["name"] == name}


# -- healthy machines pass ----------------------------------------------------------------------


@pytest.mark.parametrize("name,fake,rails,mtu", [
    ("hgx-h100", FakeNvml.hgx_h100, HGX_RAILS, 4200),
    ("dgx-h100", FakeNvml.dgx_h100, DGX_RAILS, 4092),
])
def test_a_healthy_h100_server_passes_every_check(name, fake, rails, mtu):
    report = node.run(node.SECTIONS, tree(name), fake(), fabric_args(rails, mtu))
    assert report["format"] == "lockstep.audit.node/v1"
    assert report["hardware"] == "h100-sxm"
    assert report["failures"] == [], failures(report)
    assert report["status"] == "pass" and report["errors"] == []
    checks = {r["check"] for r in report["results"] if r["status"] == "pass"}
    for check in ("gpu.count", "gpu.ecc", "gpu.row_remap", "gpu.xid", "gpu.clocks", "gpu.temperature", "gpu.power",
                  "gpu.nvlink", "gpu.fabric", "pcie.link", "pcie.replays", "pcie.acs", "pcie.aer", "affinity.rail",
                  "nic.link", "nic.speed", "nic.mtu", "nic.errors", "host.clock"):
        assert check in checks, check
    # every GPU and every rail NIC was looked at, and each PCIe switch port's ACS
    passed = {(r["check"], r["component"]["name"]) for r in report["results"] if r["status"] == "pass"}
    assert all(("gpu.ecc", f"GPU {i}") in passed for i in range(8))
    assert all(("nic.link", d) in passed for d in rails)
    assert sum(1 for c, _ in passed if c == "pcie.acs") >= 16
    # the facts behind the verdict travel with it
    assert report["facts"]["gpu"]["gpus"][0]["pcie"]["replays"] == 7  # as recorded on GPU 0
    assert report["facts"]["host"]["nccl"] and report["facts"]["host"]["clock"]["synchronized"] is True


def test_the_pcie_l40s_without_nvlink_or_fabric_skips_what_it_does_not_have():
    facts = collect.collect_gpu_facts(FakeNvml.l40s(), listen_ms=0)
    key, results = gpu_checks.evaluate(facts, [])
    assert key == "generic"  # not one of the SXM profiles: NVML's own limits only
    status = {r.check: r.status for r in results}
    assert status["gpu.nvlink"] == "skip" and status["gpu.fabric"] == "skip"
    assert worst(r.status for r in results) == "pass"


# -- each GPU defect fails with its code ---------------------------------------------------------

EXPECTED = {
    "ecc": {"DCGM_FR_VOLATILE_DBE_DETECTED", "DCGM_FR_DBE_VIOLATION", "DCGM_FR_SBE_THRESHOLD_VIOLATION"},
    "remap-pending": {"DCGM_FR_PENDING_ROW_REMAP", "DCGM_FR_VOLATILE_DBE_DETECTED"},
    "remap-failure": {"DCGM_FR_ROW_REMAP_FAILURE", "LOCKSTEP_FR_ROW_REMAP_BANKS_EXHAUSTED"},
    "pcie-gen4-x8": {"DCGM_FR_PCIE_GENERATION", "DCGM_FR_PCIE_WIDTH"},
    "xid": {"DCGM_FR_XID_ERROR", "DCGM_FR_NVLINK_ERROR_THRESHOLD"},
    "throttle-thermal": {"DCGM_FR_CLOCK_THROTTLE_THERMAL", "DCGM_FR_TEMP_VIOLATION"},
    "power-brake": {"DCGM_FR_CLOCK_THROTTLE_POWER"},
    "nvlink-down": {"DCGM_FR_NVLINK_DOWN"},
    "fabric-not-started": {"DCGM_FR_CUDA_FM_NOT_INITIALIZED"},
    "persistence-off": {"DCGM_FR_PERSISTENCE_MODE"},
    "power-capped": {"DCGM_FR_ENFORCED_POWER_LIMIT"},
    "lost": {"LOCKSTEP_FR_GPU_LOST"},
}


def test_every_fake_defect_has_an_expectation():
    assert set(EXPECTED) == set(DEFECTS)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_gpu_defect_fails_with_its_code_on_that_gpu_only(kind):
    fake = FakeNvml.hgx_h100()
    fake.gpus[6] = fake.gpus[6].with_defect(kind)
    report = node.run(["gpu", "pcie"], tree("hgx-h100"), fake, {"listen_ms": 50})
    assert codes_of(report, "GPU 6") == EXPECTED[kind], failures(report)
    assert {f["component"]["name"] for f in report["failures"]} == {"GPU 6"}
    assert report["status"] == "fail" or all(f["status"] == "warn" for f in report["failures"])
    for f in report["failures"]:  # evidence and the limit it was held to, and what to do
        assert f["action"] and f["severity"] != "none"
        if f["status"] == "fail" and f["code"] != "LOCKSTEP_FR_GPU_LOST":
            assert f["evidence"] and f["threshold"], f


def test_the_throttled_gpu_reports_the_bits_and_temperature_it_was_judged_on():
    fake = FakeNvml.hgx_h100()
    fake.gpus[5] = fake.gpus[5].with_defect("throttle-thermal")
    report = node.run(["gpu"], tree("hgx-h100"), fake, {})
    clocks = next(f for f in report["failures"] if f["check"] == "gpu.clocks")
    assert clocks["evidence"]["clocks_event_reasons"] == 0x68
    assert set(clocks["evidence"]["active"]) == {"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"}
    temp = next(f for f in report["failures"] if f["check"] == "gpu.temperature")
    assert temp["evidence"]["temperature_c"] == 91 and temp["threshold"]["slowdown"] == 89  # NVML's threshold


def test_benign_clock_reasons_pass():
    fake = FakeNvml.hgx_h100()
    fake.gpus[0].clocks_event_reasons = 0x4 | 0x1  # power cap at idle: normal
    _, results = gpu_checks.evaluate(collect.collect_gpu_facts(fake), [])
    assert next(r for r in results if r.check == "gpu.clocks" and r.component["index"] == 0).status == "pass"


def test_an_idle_gpu_at_a_lower_pcie_generation_is_a_warning_but_a_narrow_link_fails():
    fake = FakeNvml.hgx_h100()
    fake.gpus[0].pcie_generation = (1, 5, 5)  # idle power saving (clocks_event_reasons = idle)
    fake.gpus[1].pcie_generation = (1, 5, 5)
    fake.gpus[1].pcie_width = (8, 16)
    results = pcie_checks.evaluate(collect.collect_gpu_facts(fake), {}, profile=PROFILES["h100-sxm"])
    by_gpu = {}
    for r in results:
        if r.check == "pcie.link":
            by_gpu.setdefault(r.component["index"], []).append((r.status, r.code))
    assert by_gpu[0] == [("warn", "DCGM_FR_PCIE_GENERATION")]
    assert ("fail", "DCGM_FR_PCIE_WIDTH") in by_gpu[1]
    assert by_gpu[2] == [("pass", "")]


def test_volta_style_page_retirement_is_checked_where_row_remapping_is_not_supported():
    fake = FakeNvml.hgx_h100()
    fake.gpus[0].remapped_rows = None  # NOT_SUPPORTED before Ampere
    fake.gpus[0].retired_pages = {"sbe": list(range(40)), "dbe": list(range(30)), "pending": True}
    fake.gpus[1].remapped_rows = None
    fake.gpus[1].retired_pages = {"sbe": [0x1000], "dbe": [], "pending": False}
    _, results = gpu_checks.evaluate(collect.collect_gpu_facts(fake), [])
    gpu0 = {r.code for r in results if r.component.get("index") == 0 and r.status == "fail"}
    assert gpu0 == {"DCGM_FR_PENDING_PAGE_RETIREMENTS", "DCGM_FR_RETIRED_PAGES_LIMIT"}
    gpu1 = [r for r in results if r.component.get("index") == 1 and r.check == "gpu.retired_pages"]
    assert [r.status for r in gpu1] == ["pass"] and gpu1[0].evidence == {"sbe": 1, "dbe": 0, "pending": False}


def test_missing_gpus_and_missing_nvml_never_pass():
    fake = FakeNvml.hgx_h100()
    del fake.gpus[7]
    _, results = gpu_checks.evaluate(collect.collect_gpu_facts(fake), [])
    count = next(r for r in results if r.check == "gpu.count")
    assert (count.status, count.code, count.evidence, count.threshold) == (
        "fail", "DCGM_FR_DEVICE_COUNT_MISMATCH", {"gpus": 7}, {"gpus": 8})
    facts = collect.collect_gpu_facts(FakeNvml.without_library())
    _, results = gpu_checks.evaluate(facts, [], expected_gpus=8)
    assert [(r.status, r.code) for r in results] == [("fail", "DCGM_FR_CANNOT_OPEN_LIB")]
    _, results = gpu_checks.evaluate(facts, [])  # a node without GPUs: nothing to audit, not a failure
    assert [r.status for r in results] == ["skip"]


def test_an_xid_79_of_a_gpu_nvml_no_longer_lists_is_reported_on_its_pci_bus():
    fake = FakeNvml.hgx_h100()
    del fake.gpus[7]  # fell off the bus: NVML lists seven
    log = "[  901.2] NVRM: Xid (PCI:0000:db:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    _, results = gpu_checks.evaluate(collect.collect_gpu_facts(fake), parse_kernel_log(log))
    fallen = [r for r in results if r.component["name"] == "PCI 0000:db:00"]
    assert [(r.status, r.code, r.severity) for r in fallen] == [("fail", "DCGM_FR_XID_ERROR", "isolate")]
    assert "fallen off the bus" in fallen[0].message


def test_kernel_log_formats():
    text = "\n".join([
        "4,2291,901234567,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, An uncorrectable double bit error",
        "[ 12.500000] NVRM: Xid (PCI:0000:2A:00): 95, pid=2, Uncontained: FBHUB. RST: Yes, D-RST: No",
        "Nov 14 07:00:14 host kernel: NVRM: Xid (PCI:0000:3a:00 GPU-I:05): 13, Graphics Exception",
        "[ 13.0] mlx5_core 0000:19:00.0: Port module event: module 0, Cable plugged",
    ])
    events = parse_kernel_log(text)
    assert [(e["pci_bus"], e["xid"], e["t_s"]) for e in events] == [
        ("0000:18:00", 48, 901.234567), ("0000:2a:00", 95, 12.5), ("0000:3a:00", 13, None)]
    assert bus_of("00000000:2A:00.0") == "0000:2a:00" and bus_of("0000:2a:00.0") == "0000:2a:00"
    fake = FakeNvml.hgx_h100()
    _, results = gpu_checks.evaluate(collect.collect_gpu_facts(fake), events)
    by = {(r.component["name"], r.code): r for r in results if r.check == "gpu.xid" and r.status != "pass"}
    assert by[("GPU 0", "DCGM_FR_XID_ERROR")].severity == "reset"
    assert by[("GPU 1", "DCGM_FR_UNCONTAINED_ERROR")].status == "fail"
    assert by[("GPU 2", "DCGM_FR_XID_ERROR")].status == "warn"  # Xid 13: an application fault


def test_nvml_xid_events_arrive_through_the_event_api():
    fake = FakeNvml.hgx_h100()
    fake.gpus[4] = fake.gpus[4].with_defect("xid")
    facts = collect.collect_gpu_facts(fake, listen_ms=200)
    assert facts["xid_events"] == [{"pci_bus_id": "0000:9a:00.0", "xid": 74}]
    assert "nvmlEventSetFree" in fake.calls and fake.calls.count("nvmlInit") == fake.calls.count("nvmlShutdown")
    assert collect.collect_gpu_facts(fake, listen_ms=0)["xid_events"] == []


# -- the recorded defects tree ---------------------------------------------------------------------


def test_the_defects_tree_fails_each_defect_on_its_component():
    report = node.run(node.SECTIONS, tree("hgx-h100-defects"), FakeNvml.hgx_h100_defects(),
                      fabric_args(HGX_RAILS, 4200))
    got = failures(report)
    expected = {
        ("GPU 1", "fail", "DCGM_FR_VOLATILE_DBE_DETECTED"), ("GPU 1", "fail", "DCGM_FR_DBE_VIOLATION"),
        ("GPU 1", "fail", "DCGM_FR_SBE_THRESHOLD_VIOLATION"),
        ("GPU 2", "fail", "DCGM_FR_PENDING_ROW_REMAP"), ("GPU 2", "fail", "DCGM_FR_VOLATILE_DBE_DETECTED"),
        ("GPU 3", "fail", "DCGM_FR_PCIE_GENERATION"), ("GPU 3", "fail", "DCGM_FR_PCIE_WIDTH"),
        ("GPU 4", "fail", "DCGM_FR_XID_ERROR"), ("GPU 4", "warn", "DCGM_FR_NVLINK_ERROR_THRESHOLD"),
        ("GPU 5", "fail", "DCGM_FR_CLOCK_THROTTLE_THERMAL"), ("GPU 5", "fail", "DCGM_FR_TEMP_VIOLATION"),
        ("GPU 6", "warn", "DCGM_FR_XID_ERROR"),  # Xid 13 in the kernel log
        ("0000:b9:00.0", "fail", "LOCKSTEP_FR_PCIE_ACS_ENABLED"),
        ("enp92s0np0", "fail", "DCGM_FR_PCIE_GENERATION"), ("enp92s0np0", "fail", "DCGM_FR_PCIE_WIDTH"),
        ("enp218s0np0", "fail", "LOCKSTEP_FR_NIC_MTU"),
        ("enp41s0np0", "warn", "LOCKSTEP_FR_NIC_LINK_FLAPS"), ("enp41s0np0", "warn", "LOCKSTEP_FR_NIC_ERRORS"),
        ("mlx5_core NICs", "warn", "LOCKSTEP_FR_NIC_FIRMWARE_MISMATCH"),
        ("gpu-node-0007", "fail", "LOCKSTEP_FR_CLOCK_UNSYNCED"),
    }
    assert set(got) == expected, sorted(set(got) ^ expected)
    assert report["status"] == "fail"
    acs = next(f for f in report["failures"] if f["code"] == "LOCKSTEP_FR_PCIE_ACS_ENABLED")
    assert acs["evidence"] == {"acs_control": 0x1D, "acs": ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]}
    assert "setpci -s 0000:b9:00.0" in acs["action"]
    nic = next(f for f in report["failures"] if f["component"]["name"] == "enp92s0np0" and "WIDTH" in f["code"])
    assert nic["evidence"]["current_width"] == 8 and nic["threshold"]["width"] == 16
    assert report["facts"]["host"]["nccl"] == ["2.19.3"]


def test_the_defect_gpus_are_the_documented_ones():
    fake = FakeNvml.hgx_h100_defects()
    healthy = FakeNvml.hgx_h100()
    changed = {i for i in range(8) if fake.gpus[i] != healthy.gpus[i]}
    assert changed == set(HGX_H100_DEFECTS) == {1, 2, 3, 4, 5}


def test_recorded_trees_with_audit_facts_are_what_the_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(DATA / "build_trees.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    _assert_same_tree(DATA / "hgx-h100-defects", tmp_path / "hgx-h100-defects")


# -- affinity --------------------------------------------------------------------------------------


def test_crossed_rails_fail_and_name_the_nic_the_gpu_sits_next_to():
    args = fabric_args(HGX_RAILS, 4200)
    args["rails"][0]["nic"], args["rails"][1]["nic"] = HGX_RAILS[1], HGX_RAILS[0]
    report = node.run(["affinity"], tree("hgx-h100"), FakeNvml.hgx_h100(), args)
    bad = {f["component"]["name"]: f for f in report["failures"]}
    assert set(bad) == {"GPU 0", "GPU 1"}
    assert bad["GPU 0"]["code"] == "LOCKSTEP_FR_GPU_NIC_AFFINITY"
    assert bad["GPU 0"]["evidence"] == {"relation": "NODE", "nearest_nic": "enp25s0np0", "nearest_relation": "PIX"}
    assert "enp25s0np0" in bad["GPU 0"]["message"]


def test_without_a_rail_map_each_gpu_needs_a_close_nic_of_its_own():
    report = node.run(["affinity"], tree("dgx-h100"), FakeNvml.dgx_h100(), {})
    assert report["status"] == "pass"
    assert sum(1 for r in report["results"] if r["check"] == "affinity.rail") == 8
    # GPUs whose PCI addresses are not in the tree's PCIe hierarchy have no close NIC: each one fails
    report = node.run(["affinity"], tree("hgx-h100"), FakeNvml.dgx_h100(), {})
    assert [(f["status"], f["code"]) for f in report["failures"]] == [("fail", "LOCKSTEP_FR_GPU_NIC_AFFINITY")] * 8


# -- NICs and hosts --------------------------------------------------------------------------------


def test_nic_down_slow_and_missing():
    facts = collect.collect_nic_facts(tree("hgx-h100"))
    expected = [{"device": "enp73s0f0np0"}, {"device": "enp73s0f1np1"}, {"device": "enp0s99"}]
    results = nic_checks.evaluate(facts, expected=expected, mtu=1500, profile=PROFILES["h100-sxm"])
    got = {(r.component["name"], r.check, r.status, r.code) for r in results if r.status != "pass"}
    assert got == {("enp73s0f0np0", "nic.speed", "fail", "LOCKSTEP_FR_NIC_SPEED"),  # 200G where 400G expected
                   ("enp73s0f1np1", "nic.link", "fail", "LOCKSTEP_FR_NIC_DOWN"),
                   ("enp0s99", "nic.present", "fail", "LOCKSTEP_FR_NIC_MISSING")}


def test_clock_sync_decides_from_lockstep_when_it_has_a_clock_and_from_the_kernel_otherwise():
    facts = {"hostname": "n1", "clock": {"state": 5, "status": 0x40, "synchronized": False, "maxerror_us": 16000000}}
    assert [r.code for r in host_checks.evaluate(facts)] == ["LOCKSTEP_FR_CLOCK_UNSYNCED"]
    facts["lockstep_clock"] = {"synced": True, "offset_ns": 120, "sigma_ns": 40}
    assert [r.status for r in host_checks.evaluate(facts)] == ["pass"]
    facts["lockstep_clock"]["synced"] = False
    assert [r.code for r in host_checks.evaluate(facts)] == ["LOCKSTEP_FR_CLOCK_UNSYNCED"]
    drift = {"hostname": "n1", "clock": {"state": 0, "status": 1, "synchronized": True, "maxerror_us": 500000}}
    assert [(r.status, r.code) for r in host_checks.evaluate(drift)] == [("warn", "LOCKSTEP_FR_CLOCK_ERROR")]
    facts = {"hostname": "n1", "clock": {"synchronized": True, "maxerror_us": 10}, "kernel": "6.1", "nccl": ["2.21.5"]}
    results = host_checks.evaluate(facts, expect={"kernel": "6.2", "nccl": ["2.21.5"]})
    assert [(r.check, r.status) for r in results] == [("host.clock", "pass"), ("host.kernel", "fail"),
                                                      ("host.nccl", "pass")]


def test_this_machine_without_a_gpu_reports_real_host_facts():
    # the live paths: no NVML library here, real sysfs, ethtool ioctl, adjtimex
    report = node.run(["gpu", "nic", "host"], HostPaths(), FakeNvml.without_library(), {})
    assert [r["status"] for r in report["results"] if r["check"] == "gpu.nvml"] == ["skip"]
    host = report["facts"]["host"]
    assert host["clock"] is not None and isinstance(host["clock"]["synchronized"], bool)
    assert host["kernel"] and host["gpu_count"] == 0
    physical = [n for n in report["facts"]["nic"]["nics"] if n["pci_address"]]
    assert physical and all(n["driver"] for n in physical)  # ETHTOOL_GDRVINFO answered


# -- pure helpers ----------------------------------------------------------------------------------


def test_acs_capability_parsing():
    data = bytearray(0x200)
    struct.pack_into("<I", data, 0x100, 0x0001 | (2 << 16) | (0x180 << 20))  # AER -> 0x180
    struct.pack_into("<I", data, 0x180, 0x000B | (1 << 16) | (0x1C0 << 20))  # vendor specific -> 0x1C0
    struct.pack_into("<IHH", data, 0x1C0, 0x000D | (1 << 16), 0x7F, 0x0014)
    assert collect.acs_control(bytes(data)) == 0x14
    assert pcie_checks.acs_names(0x14) == ["ReqRedir", "UpstreamFwd"]
    assert collect.acs_control(bytes(data[:256])) is None  # read without root
    loop = bytearray(0x200)
    struct.pack_into("<I", loop, 0x100, 0x0001 | (0x100 << 20))  # points at itself: no endless walk
    assert collect.acs_control(bytes(loop)) is None
    assert [collect.link_generation(t) for t in ("32.0 GT/s PCIe", "8 GT/s", "2.5 GT/s PCIe", "Unknown", None)] == [
        5, 3, 1, None, None]


def test_threshold_profiles_are_chosen_by_device_id_then_name_and_cite_their_sources():
    assert profile_for(0x233010DE, "whatever")[0] == "h100-sxm"
    assert profile_for(None, "NVIDIA H200")[0] == "h200-sxm"
    assert profile_for(0x20B210DE, "")[0] == "a100-sxm"
    assert profile_for(0x26B910DE, "NVIDIA L40S") == ("generic", GENERIC)
    for key in PROFILES:
        assert any(s.startswith(key) for s in SOURCES), key


def test_results_need_a_code_to_fail():
    with pytest.raises(ValueError, match="failure code"):
        Result("x.y", {"kind": "gpu", "name": "GPU 0"}, "fail", "bad")
    assert worst(["pass", "skip", "warn"]) == "warn" and worst(["skip"]) == "pass" and worst(["fail", "error"]) == "error"


def test_nvml_fake_audit_constants_are_pynvml_s():
    pynvml = pytest.importorskip("pynvml")
    for name in dir(nvml_fake):
        if name.startswith(("NVML_", "nvmlClocksEventReason", "nvmlEventType")):
            assert getattr(pynvml, name) == getattr(nvml_fake, name), name
    fake = FakeNvml.hgx_h100()
    for name in [n for n in dir(fake) if n.startswith("nvml") and callable(getattr(fake, n))]:
        assert hasattr(pynvml, name), f"the fake has {name}, pynvml does not"


# -- the commands ----------------------------------------------------------------------------------


def _ctx(fake, paths):
    return CommandContext(command_id="c1", type="audit.node", attempt=1, deadline=1e18,
                          services={"host_paths": paths, "nvml": fake})


def test_the_audit_commands_are_registered_and_validate_their_arguments():
    load_modules()
    for name in ("audit.node", "audit.gpu", "audit.pcie", "audit.affinity", "audit.nic", "audit.host"):
        assert name in default_registry, name
    ctype = default_registry.get("audit.node")
    with pytest.raises(ArgError, match="mtu"):
        validate_args(ctype.args, {"mtu": 10})
    args = validate_args(ctype.args, {"nics": [{"device": "enp25s0np0", "mtu": "big"}]})
    with pytest.raises(ArgError, match=r"nics\[0\]\.mtu must be int"):
        ctype.handler(args, _ctx(FakeNvml.hgx_h100(), tree("hgx-h100")))
    args = validate_args(ctype.args, {"sections": ["gpu", "disks"]})
    with pytest.raises(ArgError, match="'disks' is not one of"):
        ctype.handler(args, _ctx(FakeNvml.hgx_h100(), tree("hgx-h100")))


def test_audit_gpu_command_reports_the_defect_gpus():
    load_modules()
    ctype = default_registry.get("audit.gpu")
    args = validate_args(ctype.args, {"listen_ms": 10})
    result = ctype.handler(args, _ctx(FakeNvml.hgx_h100_defects(), tree("hgx-h100")))
    assert result["check"] == "gpu" and result["status"] == "fail"
    assert {f["component"]["name"] for f in result["failures"]} == {"GPU 1", "GPU 2", "GPU 4", "GPU 5"}
