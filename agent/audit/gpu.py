"""GPU health checks: pure evaluations of the facts ``collect.collect_gpu_facts`` gathers.

ECC (volatile and aggregate, DRAM and SRAM), retired pages (Volta and older) and row remapping
(Ampere and newer), Xid events (the kernel log since boot, and NVML events while listening),
clocks-event ("throttle") reasons, temperature and power against NVML's own limits (the
profile's when NVML cannot say), NVLink state and error counters, the NVSwitch fabric state,
persistence and ECC modes, and the GPU count. Limits: ``agent.audit.thresholds``.

NVML semantics relied on (NVML API reference, "Device Queries"):

- ``nvmlDeviceGetTotalEccErrors(VOLATILE)`` counts since the driver loaded; ``AGGREGATE``
  persists across reboots (kept in the InfoROM). Uncorrectable DRAM errors on Ampere+ trigger a
  row remap, so aggregate DRAM counts alone are evidence, not a failure.
- ``nvmlDeviceGetRemappedRows`` -> (correctable rows, uncorrectable rows, pending, failure):
  pending means a remap waits for the next GPU reset; failure that no spare row was left.
  ``NOT_SUPPORTED`` before Ampere, where ``nvmlDeviceGetRetiredPages`` applies instead (and is
  ``NOT_SUPPORTED`` on Ampere+: nvidia-smi shows "Retired Pages ... N/A").
- Clocks event reasons are a bit mask; HW slowdown (0x8) is set together with its cause,
  HW thermal (0x40) or HW power brake (0x80); GPU idle (0x1), application clocks (0x2), SW power
  cap (0x4), sync boost (0x10) and display clocks (0x100) are benign (Azure NHC
  check_gpu_clock_throttling ignores idle, none and SW power cap).
"""

from __future__ import annotations

from agent.audit.results import Result, bad, ok, skip
from agent.audit.thresholds import COMMON, profile_for
from agent.audit.thresholds import profile as threshold_profile
from agent.audit.xid import CRITICAL, bus_of

IDLE = 0x1
APP_CLOCKS = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
DISPLAY_CLOCKS = 0x100
_REASON_NAMES = {IDLE: "gpu_idle", APP_CLOCKS: "applications_clocks", SW_POWER_CAP: "sw_power_cap",
                 HW_SLOWDOWN: "hw_slowdown", SYNC_BOOST: "sync_boost", SW_THERMAL: "sw_thermal_slowdown",
                 HW_THERMAL: "hw_thermal_slowdown", HW_POWER_BRAKE: "hw_power_brake_slowdown",
                 DISPLAY_CLOCKS: "display_clocks"}
COOLING = ("Verify the cooling of this machine (fans, airflow, thermal interface) and run a field diagnostic "
           "on the GPU.")


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in _REASON_NAMES.items() if mask & bit]


def component(gpu: dict) -> dict:
    return {"kind": "gpu", "name": f"GPU {gpu['index']}", "index": gpu["index"], "uuid": gpu.get("uuid", ""),
            "pci_bus_id": gpu.get("pci_bus_id", "")}


def hardware_of(facts: dict, override: str | None = None) -> tuple[str, dict]:
    """The profile of a node's GPUs (the first recognised one), or the override."""
    if override:
        return override, threshold_profile(override)
    for gpu in facts.get("gpus", []):
        key, prof = profile_for(gpu.get("pci_device_id"), gpu.get("name"))
        if key != "generic":
            return key, prof
    return profile_for(None, None)


def _ecc(gpu: dict, comp: dict) -> list[Result]:
    limits = COMMON["ecc"]
    ecc = gpu.get("ecc")
    mode = gpu.get("ecc_mode")
    if mode is None:
        return [skip("gpu.ecc", comp, "This GPU has no ECC memory.")]
    out: list[Result] = []
    if not mode["current"]:
        out.append(bad("gpu.ecc_mode", comp, "fail", "DCGM_FR_ECC_DISABLED", "config",
                       "ECC is disabled on this GPU.", "Enable ECC (nvidia-smi -e 1) and reset the GPU.",
                       {"ecc_current": False, "ecc_pending": mode["pending"]}, {"ecc_current": True}))
    if ecc is None:
        return out + [bad("gpu.ecc", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                          "The ECC error counters could not be read.", "Check the NVML errors of this node.")]
    vol_unc = ecc["volatile"].get("uncorrected")
    if vol_unc is None:
        out.append(bad("gpu.ecc", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                       "The volatile uncorrectable ECC counter could not be read.", "Check the NVML errors of this node."))
    elif vol_unc > limits["volatile_uncorrected_max"]:
        out.append(bad("gpu.ecc", comp, "fail", "DCGM_FR_VOLATILE_DBE_DETECTED", "reset",
                       f"{vol_unc} uncorrectable ECC error(s) since the driver loaded.",
                       "Drain the GPU and reset it; replace it if errors recur.",
                       {"volatile_uncorrected": vol_unc}, {"volatile_uncorrected_max": limits["volatile_uncorrected_max"]}))
    sram, dram = ecc.get("sram") or {}, ecc.get("dram") or {}
    sram_unc = max((v for k, v in sram.items() if k.startswith("uncorrected") and v is not None), default=None)
    sram_cor = max((v for k, v in sram.items() if k.startswith("corrected") and v is not None), default=None)
    if sram_unc is not None and sram_unc > limits["sram_uncorrected_max"]:
        out.append(bad("gpu.ecc", comp, "fail", "DCGM_FR_DBE_VIOLATION", "triage",
                       f"{sram_unc} uncorrectable SRAM ECC error(s) recorded.",
                       "Run a field diagnostic on the GPU; it may need an RMA.",
                       {"sram_uncorrected": sram_unc}, {"sram_uncorrected_max": limits["sram_uncorrected_max"]}))
    if sram_cor is not None and sram_cor > limits["sram_corrected_max"]:
        out.append(bad("gpu.ecc", comp, "fail", "DCGM_FR_SBE_THRESHOLD_VIOLATION", "monitor",
                       f"{sram_cor} correctable SRAM ECC errors recorded, above {limits['sram_corrected_max']}.",
                       "Run a field diagnostic on the GPU; replace it if the count keeps growing.",
                       {"sram_corrected": sram_cor}, {"sram_corrected_max": limits["sram_corrected_max"]}))
    dram_max = max((v for v in dram.values() if v is not None), default=None)
    if dram_max is not None and dram_max > limits["dram_errors_max"]:
        out.append(bad("gpu.ecc", comp, "fail", "DCGM_FR_SBE_THRESHOLD_VIOLATION", "triage",
                       f"{dram_max} DRAM ECC errors recorded, above {limits['dram_errors_max']}.",
                       "Run a field diagnostic on the GPU memory.",
                       {"dram_errors": dram_max}, {"dram_errors_max": limits["dram_errors_max"]}))
    if not out:
        out.append(ok("gpu.ecc", comp, "No uncorrectable ECC errors; correctable counts within limits.",
                      {"volatile": ecc["volatile"], "aggregate": ecc["aggregate"]},
                      {k: v for k, v in limits.items()}))
    return out


def _memory_retirement(gpu: dict, comp: dict) -> list[Result]:
    out: list[Result] = []
    rows, pages = gpu.get("remapped_rows"), gpu.get("retired_pages")
    if rows is not None:
        limit = COMMON["row_remap"]["uncorrectable_rows_max"]
        ev = dict(rows)
        if rows["failure"]:
            out.append(bad("gpu.row_remap", comp, "fail", "DCGM_FR_ROW_REMAP_FAILURE", "isolate",
                           "A memory row could not be remapped: no spare row was left.",
                           "Take the GPU out of service; it needs an RMA.", ev, {"failure": False}))
        if rows["pending"]:
            out.append(bad("gpu.row_remap", comp, "fail", "DCGM_FR_PENDING_ROW_REMAP", "reset",
                           "A row remap is pending: the faulty memory stays in use until the GPU is reset.",
                           "Drain the GPU and reset it (nvidia-smi -r) to apply the remap.", ev, {"pending": False}))
        if rows["uncorrectable"] > limit:
            out.append(bad("gpu.row_remap", comp, "fail", "DCGM_FR_UNCORRECTABLE_ROW_REMAP", "isolate",
                           f"{rows['uncorrectable']} rows remapped for uncorrectable errors, above {limit}.",
                           "Take the GPU out of service; it needs an RMA.", ev, {"uncorrectable_rows_max": limit}))
        hist = gpu.get("remap_histogram")
        if hist and hist.get("none", 0) > 0:
            out.append(bad("gpu.row_remap", comp, "warn", "LOCKSTEP_FR_ROW_REMAP_BANKS_EXHAUSTED", "monitor",
                           f"{hist['none']} memory bank(s) have no spare row left.",
                           "Plan the GPU's replacement: the next error in those banks cannot be remapped.",
                           {"histogram": hist}, {"banks_without_spare_max": 0}))
        if not out:
            out.append(ok("gpu.row_remap", comp, "No pending or failed row remaps.", ev,
                          {"pending": False, "failure": False, "uncorrectable_rows_max": limit}))
    if pages is not None:
        limit = COMMON["retired_pages"]["total_max"]
        total = pages["sbe"] + pages["dbe"]
        if pages["pending"]:
            out.append(bad("gpu.retired_pages", comp, "fail", "DCGM_FR_PENDING_PAGE_RETIREMENTS", "reset",
                           "A page retirement is pending until the GPU is reset.",
                           "Drain the GPU and reset it to retire the page.", pages, {"pending": False}))
        if total > limit:
            out.append(bad("gpu.retired_pages", comp, "fail", "DCGM_FR_RETIRED_PAGES_LIMIT", "isolate",
                           f"{total} pages retired, above {limit}: the retirement table is full.",
                           "Take the GPU out of service; it needs an RMA.", pages, {"total_max": limit}))
        if not any(r.check == "gpu.retired_pages" for r in out):
            out.append(ok("gpu.retired_pages", comp, "No pending page retirement; retired pages within limits.",
                          pages, {"total_max": limit}))
    if rows is None and pages is None:
        out.append(skip("gpu.row_remap", comp, "This GPU reports neither row remapping nor page retirement."))
    return out


def _xids(events: list[dict], comp: dict) -> list[Result]:
    out = []
    for xid in sorted({e["xid"] for e in events}):
        mine = [e for e in events if e["xid"] == xid]
        evidence = {"xid": xid, "count": len(mine), "last": mine[-1].get("text", ""),
                    "sources": sorted({e.get("source", "kernel log") for e in mine})}
        if xid in CRITICAL:
            severity, meaning, action = CRITICAL[xid]
            code = "DCGM_FR_UNCONTAINED_ERROR" if xid == 95 else "DCGM_FR_XID_ERROR"
            out.append(bad("gpu.xid", comp, "fail", code, severity, f"Xid {xid} ({meaning}), {len(mine)} time(s).",
                           action, evidence, {"critical_xids": sorted(CRITICAL)}))
        else:
            out.append(bad("gpu.xid", comp, "warn", "DCGM_FR_XID_ERROR", "monitor",
                           f"Xid {xid} {len(mine)} time(s) (usually an application fault).",
                           "Look at the application that ran on this GPU; escalate if the Xid recurs without one.",
                           evidence, {"critical_xids": sorted(CRITICAL)}))
    if not out:
        out.append(ok("gpu.xid", comp, "No Xid events since boot.", {"xids": []}))
    return out


def _clocks(gpu: dict, comp: dict) -> list[Result]:
    mask = gpu.get("clocks_event_reasons")
    if mask is None:
        return [skip("gpu.clocks", comp, "Clocks event reasons are not reported by this GPU.")]
    ev = {"clocks_event_reasons": mask, "active": reason_names(mask)}
    benign = IDLE | APP_CLOCKS | SW_POWER_CAP | SYNC_BOOST | DISPLAY_CLOCKS
    th = {"benign": reason_names(benign)}
    if mask & HW_THERMAL:
        return [bad("gpu.clocks", comp, "fail", "DCGM_FR_CLOCK_THROTTLE_THERMAL", "triage",
                    "Clocks are cut by the hardware thermal slowdown.", COOLING, ev, th)]
    if mask & HW_POWER_BRAKE:
        return [bad("gpu.clocks", comp, "fail", "DCGM_FR_CLOCK_THROTTLE_POWER", "triage",
                    "Clocks are cut by the hardware power brake (the board's power supply signalled it).",
                    "Check the power supplies and the power brake signal of this server.", ev, th)]
    if mask & HW_SLOWDOWN:
        return [bad("gpu.clocks", comp, "fail", "DCGM_FR_THROTTLING_VIOLATION", "triage",
                    "Clocks are cut by a hardware slowdown.", "Check cooling and power; run a field diagnostic.", ev, th)]
    if mask & SW_THERMAL:
        return [bad("gpu.clocks", comp, "warn", "DCGM_FR_CLOCK_THROTTLE_THERMAL", "monitor",
                    "The driver lowers clocks to keep the GPU under its temperature target.", COOLING, ev, th)]
    return [ok("gpu.clocks", comp, "No hardware or thermal clock slowdown.", ev, th)]


def _temperature(gpu: dict, comp: dict, prof: dict) -> list[Result]:
    temp = gpu.get("temperature_c")
    if temp is None:
        return [bad("gpu.temperature", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                    "The GPU temperature could not be read.", "Check the NVML errors of this node.")]
    nv = gpu.get("temperature_thresholds_c") or {}
    fallback = prof["gpu"].get("temperature_c") or {}
    limits = {k: nv.get(k) if nv.get(k) else fallback.get(k) for k in ("gpu_max", "slowdown", "shutdown", "memory_max")}
    ev = {"temperature_c": temp, "memory_temperature_c": gpu.get("memory_temperature_c")}
    out = []
    if limits["slowdown"] is not None and temp >= limits["slowdown"]:
        out.append(bad("gpu.temperature", comp, "fail", "DCGM_FR_TEMP_VIOLATION", "triage",
                       f"GPU at {temp} C, at or above its slowdown temperature {limits['slowdown']} C.",
                       COOLING, ev, limits))
    elif limits["gpu_max"] is not None and temp >= limits["gpu_max"]:
        out.append(bad("gpu.temperature", comp, "warn", "DCGM_FR_TEMP_VIOLATION", "monitor",
                       f"GPU at {temp} C, at or above its maximum operating temperature {limits['gpu_max']} C.",
                       COOLING, ev, limits))
    mem = gpu.get("memory_temperature_c")
    if mem is not None and limits["memory_max"] is not None and mem >= limits["memory_max"]:
        out.append(bad("gpu.temperature", comp, "fail", "DCGM_FR_TEMP_VIOLATION", "triage",
                       f"GPU memory at {mem} C, at or above its maximum {limits['memory_max']} C.", COOLING, ev, limits))
    return out or [ok("gpu.temperature", comp, f"GPU at {temp} C, below its limits.", ev, limits)]


def _power(gpu: dict, comp: dict, prof: dict) -> list[Result]:
    power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
    if power is None:
        return [bad("gpu.power", comp, "warn", "DCGM_FR_POWER_UNREADABLE", "monitor",
                    "The GPU's power draw cannot be read.", "Check the NVML errors of this node; reset the GPU.")]
    expected = prof["gpu"].get("power_limit_w")
    candidates = [v for v in (expected, gpu.get("default_power_limit_w")) if v]
    floor = min(candidates) if candidates else None
    ev = {"power_w": power, "power_limit_w": limit, "default_power_limit_w": gpu.get("default_power_limit_w")}
    if limit is not None and floor is not None and limit < floor * 0.98:
        return [bad("gpu.power", comp, "fail", "DCGM_FR_ENFORCED_POWER_LIMIT", "config",
                    f"The enforced power limit is {limit:g} W, below the {floor:g} W this GPU should run at.",
                    "Restore the default power limit (nvidia-smi -pl) or find what capped it (BMC, DCGM policy).",
                    ev, {"power_limit_min_w": floor})]
    return [ok("gpu.power", comp, f"Drawing {power:g} W under a {limit if limit is not None else '?'} W limit.", ev,
               {"power_limit_min_w": floor} if floor else {})]


def _nvlink(gpu: dict, comp: dict, prof: dict) -> list[Result]:
    links = gpu.get("nvlinks") or []
    expected = prof["gpu"].get("nvlinks")
    if not links and not expected:
        return [skip("gpu.nvlink", comp, "This GPU has no NVLink.")]
    out: list[Result] = []
    active = [lk for lk in links if lk["active"]]
    if expected and len(links) < expected:
        out.append(bad("gpu.nvlink", comp, "fail", "DCGM_FR_GPU_EXPECTED_NVLINKS_UP", "triage",
                       f"NVML reports {len(links)} NVLink links, {expected} expected.",
                       "Check the GPU's NVLink/NVSwitch baseboard; run a field diagnostic.",
                       {"links": len(links), "active": len(active)}, {"links": expected}))
    for lk in links:
        if not lk["active"]:
            out.append(bad("gpu.nvlink", comp, "fail", "DCGM_FR_NVLINK_DOWN", "triage",
                           f"NVLink {lk['link']} is down.", "Reset the GPU; if the link stays down, service the baseboard.",
                           {"link": lk["link"], "active": False}, {"active": True}))
    limits = COMMON["nvlink"]
    for lk in active:
        errors = {k: v for k, v in (lk.get("errors") or {}).items() if v}
        if errors:
            crc = any(k.startswith("crc") for k in errors)
            over = {k: v for k, v in errors.items() if v > limits.get(f"{k}_max", 0)}
            if over:
                out.append(bad("gpu.nvlink", comp, "warn",
                               "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD" if crc else "DCGM_FR_NVLINK_ERROR_THRESHOLD",
                               "monitor", f"NVLink {lk['link']} has error counts {over}.",
                               "Watch the counters; reset the GPU and service the link if they keep growing.",
                               {"link": lk["link"], "errors": errors}, limits))
    if not out:
        out.append(ok("gpu.nvlink", comp, f"{len(active)} of {len(links)} NVLink links up, no errors.",
                      {"links": len(links), "active": len(active)}, {"links": expected} if expected else {}))
    return out


def _fabric(gpu: dict, comp: dict, prof: dict) -> list[Result]:
    fabric = gpu.get("fabric")
    if fabric is None:
        if prof["gpu"].get("fabric_manager"):
            return [bad("gpu.fabric", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                        "The NVSwitch fabric state could not be read.", "Check the NVML errors of this node.")]
        return [skip("gpu.fabric", comp, "No NVSwitch fabric on this GPU.")]
    if fabric["state"] != "completed" or fabric["status"] != 0:
        return [bad("gpu.fabric", comp, "fail", "DCGM_FR_CUDA_FM_NOT_INITIALIZED", "config",
                    f"The NVSwitch fabric is {fabric['state'].replace('_', ' ')} (status {fabric['status']}).",
                    "Start nvidia-fabricmanager (same version as the driver) and check its log.",
                    fabric, {"state": "completed", "status": 0})]
    return [ok("gpu.fabric", comp, "NVSwitch fabric training completed.", fabric, {"state": "completed"})]


def evaluate(facts: dict, xid_events: list[dict], *, expected_gpus: int | None = None,
             hardware: str | None = None) -> tuple[str, list[Result]]:
    """(hardware profile, results) for the GPUs of one node.

    ``facts``: ``collect_gpu_facts`` output. ``xid_events``: parsed kernel log events
    (``xid.parse_kernel_log``), each with ``pci_bus``; NVML events in ``facts["xid_events"]``
    are added. ``expected_gpus``: how many GPUs the node must have (default: the profile's).
    """
    key, prof = hardware_of(facts, hardware)
    host = {"kind": "host", "name": "GPUs"}
    gpus = facts.get("gpus", [])
    expected = expected_gpus if expected_gpus is not None else prof["gpu"].get("per_node")
    results: list[Result] = []
    if not facts.get("available"):
        reason = "; ".join(facts.get("errors", [])) or "NVML is not available"
        if expected:
            results.append(bad("gpu.nvml", host, "fail", "DCGM_FR_CANNOT_OPEN_LIB", "config",
                               f"No GPU can be audited: {reason}.",
                               "Install the NVIDIA driver and nvidia-ml-py, then audit again.",
                               {"nvml": reason}, {"gpus": expected}))
        else:
            results.append(skip("gpu.nvml", host, f"No GPUs to audit ({reason})."))
        return key, results
    if expected is not None and len(gpus) != expected:
        results.append(bad("gpu.count", host, "fail", "DCGM_FR_DEVICE_COUNT_MISMATCH", "triage",
                           f"NVML lists {len(gpus)} GPUs, {expected} expected.",
                           "Find the missing GPU (fallen off the bus? see Xid 79) and service the node.",
                           {"gpus": len(gpus)}, {"gpus": expected}))
    elif expected is not None:
        results.append(ok("gpu.count", host, f"{len(gpus)} GPUs, as expected.", {"gpus": len(gpus)}, {"gpus": expected}))
    by_bus: dict[str, list[dict]] = {}
    for e in xid_events:
        by_bus.setdefault(e["pci_bus"], []).append(e | {"source": "kernel log"})
    for e in facts.get("xid_events", []):
        by_bus.setdefault(bus_of(e["pci_bus_id"]) if e.get("pci_bus_id") else "", []).append(
            {"xid": e["xid"], "text": "", "source": "nvml event"})
    known_buses = set()
    for gpu in gpus:
        comp = component(gpu)
        if not gpu.get("reachable", True):
            results.append(bad("gpu.reachable", comp, "fail", "LOCKSTEP_FR_GPU_LOST", "isolate",
                               "NVML cannot reach this GPU (GPU is lost).",
                               "Take the node out of service; reset or reseat the GPU.", {"reachable": False},
                               {"reachable": True}))
            if gpu.get("pci_bus_id"):
                known_buses.add(bus_of(gpu["pci_bus_id"]))
            continue
        bus = bus_of(gpu["pci_bus_id"]) if gpu.get("pci_bus_id") else ""
        known_buses.add(bus)
        if gpu.get("persistence_mode") is False:
            results.append(bad("gpu.persistence", comp, "warn", "DCGM_FR_PERSISTENCE_MODE", "config",
                               "Persistence mode is disabled.", "Run nvidia-persistenced (or nvidia-smi -pm 1).",
                               {"persistence_mode": False}, {"persistence_mode": True}))
        results += _ecc(gpu, comp)
        results += _memory_retirement(gpu, comp)
        results += _xids(by_bus.get(bus, []), comp)
        results += _clocks(gpu, comp)
        results += _temperature(gpu, comp, prof)
        results += _power(gpu, comp, prof)
        results += _nvlink(gpu, comp, prof)
        results += _fabric(gpu, comp, prof)
    for bus, events in sorted(by_bus.items()):
        if bus not in known_buses:  # a GPU that fell off the bus is no longer listed by NVML
            results += _xids(events, {"kind": "gpu", "name": f"PCI {bus or 'unknown'}", "pci_bus_id": bus})
    return key, results
