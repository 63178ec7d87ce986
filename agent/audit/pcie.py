"""PCIe checks: pure evaluations of GPU links (NVML), NIC and switch-port links (sysfs), replays,
AER counters and ACS on the PCIe switch ports between GPUs and NICs.

- Generation and width: a link trained below what the device and its slot support (NVML's
  ``max`` is the lower of the GPU's and the host's maximum; sysfs ``max_link_*`` likewise for a
  NIC or a switch port) or below the hardware profile's expectation fails with
  ``DCGM_FR_PCIE_GENERATION`` / ``DCGM_FR_PCIE_WIDTH``, as DCGM's pcie plugin does. An *idle*
  GPU may lower its link speed to save power, so a lower generation on an idle GPU is a warning
  to re-check under load; a narrower width never is.
- Replays since reset above DCGM's default limit fail (``DCGM_FR_PCIE_REPLAY_THRESHOLD_VIOLATION``).
- ACS (Access Control Services) redirecting peer-to-peer requests or completions (``ReqRedir``,
  ``CmpltRedir``) or applying egress control on a switch port sends GPUDirect traffic through
  the root complex (NCCL troubleshooting guide: disable ACS); other ACS bits are a warning.
"""

from __future__ import annotations

from agent.audit.results import Result, bad, ok, skip
from agent.audit.thresholds import COMMON

ACS_BITS = {0x1: "SrcValid", 0x2: "TransBlk", 0x4: "ReqRedir", 0x8: "CmpltRedir", 0x10: "UpstreamFwd",
            0x20: "EgressCtrl", 0x40: "DirectTrans"}
ACS_P2P_BLOCKING = 0x4 | 0x8 | 0x20
IDLE = 0x1
AER_CORRECTABLE_MAX = 100  # GUESS: a few correctable errors since boot are common; hundreds are not


def acs_names(control: int) -> list[str]:
    return [name for bit, name in ACS_BITS.items() if control & bit]


def _link_results(check: str, comp: dict, link: dict, expected_gen: int | None, expected_width: int | None,
                  idle: bool = False) -> list[Result]:
    cur_gen, max_gen = link.get("current_generation"), link.get("max_generation")
    cur_w, max_w = link.get("current_width"), link.get("max_width")
    want_gen = max(v for v in (expected_gen, max_gen) if v) if (expected_gen or max_gen) else None
    want_w = max(v for v in (expected_width, max_w) if v) if (expected_width or max_w) else None
    ev = {"current_generation": cur_gen, "max_generation": max_gen, "current_width": cur_w, "max_width": max_w}
    th = {"generation": want_gen, "width": want_w}
    if cur_gen is None and cur_w is None:
        # sysfs has link attributes for every device with a PCIe capability; none: not a PCIe link
        # (conventional PCI, a paravirtual NIC), and NVML answers NOT_SUPPORTED likewise
        return [skip(check, comp, "This device reports no PCIe link (not PCI Express, or virtual).")]
    out = []
    if want_w and cur_w is not None and cur_w < want_w:
        out.append(bad(check, comp, "fail", "DCGM_FR_PCIE_WIDTH", "triage",
                       f"PCIe link trained at x{cur_w}, x{want_w} expected.",
                       "Reseat the device or its riser/cable; check the slot and the BIOS bifurcation setting.", ev, th))
    if want_gen and cur_gen is not None and cur_gen < want_gen:
        if idle:
            out.append(bad(check, comp, "warn", "DCGM_FR_PCIE_GENERATION", "monitor",
                           f"PCIe link at Gen{cur_gen}, Gen{want_gen} expected, while the GPU is idle "
                           "(it may save power by lowering its link speed).",
                           "Re-run the check while the GPU is under load.", ev, th))
        else:
            out.append(bad(check, comp, "fail", "DCGM_FR_PCIE_GENERATION", "triage",
                           f"PCIe link trained at Gen{cur_gen}, Gen{want_gen} expected.",
                           "Check the BIOS PCIe speed setting, reseat the device or its riser/cable.", ev, th))
    return out or [ok(check, comp, f"PCIe Gen{cur_gen} x{cur_w}, as expected.", ev, th)]


def _aer(comp: dict, link: dict) -> list[Result]:
    fatal, nonfatal, correctable = link.get("aer_fatal"), link.get("aer_nonfatal"), link.get("aer_correctable")
    ev = {"aer_fatal": fatal, "aer_nonfatal": nonfatal, "aer_correctable": correctable}
    th = {"aer_fatal_max": 0, "aer_nonfatal_max": 0, "aer_correctable_max": AER_CORRECTABLE_MAX}
    if fatal is None and nonfatal is None and correctable is None:
        return []
    if fatal:
        return [bad("pcie.aer", comp, "fail", "LOCKSTEP_FR_PCIE_AER_FATAL", "isolate",
                    f"{fatal} fatal PCIe error(s) since boot.", "Take the device out of service and inspect the slot.",
                    ev, th)]
    if nonfatal:
        return [bad("pcie.aer", comp, "warn", "LOCKSTEP_FR_PCIE_AER_NONFATAL", "triage",
                    f"{nonfatal} non-fatal uncorrectable PCIe error(s) since boot.",
                    "Reseat the device; watch the counters.", ev, th)]
    if correctable and correctable > AER_CORRECTABLE_MAX:
        return [bad("pcie.aer", comp, "warn", "DCGM_FR_PCIE_H_REPLAY_VIOLATION", "monitor",
                    f"{correctable} correctable PCIe errors since boot.", "Watch the counters; reseat if they grow.",
                    ev, th)]
    return [ok("pcie.aer", comp, "No uncorrectable PCIe errors.", ev, th)]


def evaluate(gpu_facts: dict, pcie_facts: dict, *, profile: dict) -> list[Result]:
    """Results for every GPU and NIC link, and every PCIe switch port above them."""
    results: list[Result] = []
    replays_max = COMMON["pcie"]["replays_max"]
    for gpu in gpu_facts.get("gpus", []):
        if not gpu.get("reachable", True) or "pcie" not in gpu:
            continue
        comp = {"kind": "gpu", "name": f"GPU {gpu['index']}", "index": gpu["index"], "pci_bus_id": gpu.get("pci_bus_id", "")}
        p = gpu["pcie"]
        link = {"current_generation": p.get("current_generation"), "max_generation": p.get("max_generation"),
                "current_width": p.get("current_width"), "max_width": p.get("max_width")}
        idle = bool((gpu.get("clocks_event_reasons") or 0) & IDLE)
        results += _link_results("pcie.link", comp, link, profile["gpu"].get("pcie_generation"),
                                 profile["gpu"].get("pcie_width"), idle=idle)
        replays = p.get("replays")
        if replays is None:
            results.append(skip("pcie.replays", comp, "This GPU does not report PCIe replays."))
        elif replays > replays_max:
            results.append(bad("pcie.replays", comp, "fail", "DCGM_FR_PCIE_REPLAY_THRESHOLD_VIOLATION", "triage",
                               f"{replays} PCIe replays since reset, above {replays_max}.",
                               "Reseat the GPU; check its riser and the slot's signal integrity.",
                               {"replays": replays}, {"replays_max": replays_max}))
        else:
            results.append(ok("pcie.replays", comp, f"{replays} PCIe replays since reset.", {"replays": replays},
                              {"replays_max": replays_max}))
    bridges = pcie_facts.get("bridges", {})
    checked_bridges: set[str] = set()
    for dev in pcie_facts.get("devices", []):
        comp = {"kind": dev["kind"], "name": dev["name"], "pci_bus_id": dev["bdf"]}
        if dev["link"] is None:
            results.append(bad("pcie.link", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                               f"{dev['bdf']} is not in this host's PCI tree.", "Check the device's PCI address."))
            continue
        if dev["kind"] == "nic":
            results += _link_results("pcie.link", comp, dev["link"], profile["nic"].get("pcie_generation"),
                                     profile["nic"].get("pcie_width"))
        results += _aer(comp, dev["link"])
        for bdf in dev["bridges"]:
            if bdf in checked_bridges:
                continue
            checked_bridges.add(bdf)
            results += _bridge(bdf, bridges[bdf])
    return results


def _bridge(bdf: str, bridge: dict) -> list[Result]:
    comp = {"kind": "pcie_bridge", "name": bdf, "pci_bus_id": bdf}
    out = []
    if bridge.get("role") == "upstream" and (bridge.get("current_width") is not None
                                             or bridge.get("current_generation") is not None):
        # the link to the parent trains to the lower of the two ends' maxima
        link = dict(bridge)
        for key in ("generation", "width"):
            own, parent = bridge.get(f"max_{key}"), bridge.get(f"parent_max_{key}")
            link[f"max_{key}"] = min(v for v in (own, parent) if v) if (own or parent) else None
        out += _link_results("pcie.link", comp, link, None, None)
    acs = bridge.get("acs_control")
    if not bridge.get("config_readable"):
        out.append(skip("pcie.acs", comp, "ACS not read: the extended PCI config space needs root."))
    elif acs is None:
        out.append(ok("pcie.acs", comp, "No ACS capability on this switch port.", {"acs": None}))
    elif acs & ACS_P2P_BLOCKING:
        out.append(bad("pcie.acs", comp, "fail", "LOCKSTEP_FR_PCIE_ACS_ENABLED", "config",
                       f"ACS redirects peer-to-peer traffic on this switch port ({', '.join(acs_names(acs))}): "
                       "GPUDirect RDMA and P2P go through the root complex.",
                       f"Disable ACS on the port (setpci -s {bdf} ECAP_ACS+0x6.w=0000) or in the BIOS.",
                       {"acs_control": acs, "acs": acs_names(acs)}, {"acs_control": 0}))
    elif acs:
        out.append(bad("pcie.acs", comp, "warn", "LOCKSTEP_FR_PCIE_ACS_ENABLED", "config",
                       f"ACS is partly enabled on this switch port ({', '.join(acs_names(acs))}).",
                       f"Disable ACS on the port (setpci -s {bdf} ECAP_ACS+0x6.w=0000) or in the BIOS.",
                       {"acs_control": acs, "acs": acs_names(acs)}, {"acs_control": 0}))
    else:
        out.append(ok("pcie.acs", comp, "ACS is disabled on this switch port.", {"acs_control": 0}))
    return out
