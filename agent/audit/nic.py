"""NIC checks: pure evaluations of link state, speed, MTU, driver/firmware and error counters.

Which NICs: the ``expected`` list when given (the fabric NICs the console knows from the
topology: ``[{"device": "ibp24s0", "rail": 0, "mtu": 4092, "speed_mbps": 400000}]``), else every
NIC backed by a PCI device or an RDMA port (management bonds and container plumbing are left out).
Expected speed: per NIC, else the ``speed_mbps`` argument, else the hardware profile's; expected
MTU: per NIC, else the ``mtu`` argument (an MTU is a property of the fabric, so there is no
hardware default: without one, only the fleet agreement compares MTUs).
"""

from __future__ import annotations

from agent.audit.results import Result, bad, ok, skip
from agent.audit.thresholds import COMMON


def component(nic: dict) -> dict:
    return {"kind": "nic", "name": nic["device"], "rdma_device": nic.get("rdma_device", ""),
            "pci_bus_id": nic.get("pci_address", "")}


def _physical(nic: dict) -> bool:
    return bool(nic.get("pci_address") or nic.get("rdma_device"))


def _one(nic: dict, want: dict) -> list[Result]:
    comp = component(nic)
    out: list[Result] = []
    state = nic.get("link_state")
    ib = nic.get("ib_port") or {}
    ev_state = {"link_state": state, "ib_state": ib.get("state"), "ib_phys_state": ib.get("phys_state")}
    if state != "up" or (ib and ib.get("phys_state") and ib["phys_state"] != "LinkUp"):
        out.append(bad("nic.link", comp, "fail", "LOCKSTEP_FR_NIC_DOWN", "triage",
                       f"The link of {nic['device']} is {state}" + (f" (port {ib.get('phys_state')})" if ib else "") + ".",
                       "Check the cable, the optic and the switch port; reseat or replace them.", ev_state,
                       {"link_state": "up"}))
        return out
    out.append(ok("nic.link", comp, "Link up.", ev_state, {"link_state": "up"}))
    speed, want_speed = nic.get("speed_mbps"), want.get("speed_mbps")
    if want_speed:
        if speed is None:
            out.append(bad("nic.speed", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                           "The link speed could not be read.", "Check the driver (ethtool IFNAME).",
                           {"speed_mbps": None}, {"speed_mbps": want_speed}))
        elif speed < want_speed:
            out.append(bad("nic.speed", comp, "fail", "LOCKSTEP_FR_NIC_SPEED", "triage",
                           f"Link at {speed // 1000} Gb/s, {want_speed // 1000} Gb/s expected.",
                           "Reseat or replace the cable/optic; check the switch port's speed setting.",
                           {"speed_mbps": speed}, {"speed_mbps": want_speed}))
        else:
            out.append(ok("nic.speed", comp, f"Link at {speed // 1000} Gb/s.", {"speed_mbps": speed},
                          {"speed_mbps": want_speed}))
    else:
        out.append(skip("nic.speed", comp, "No expected speed for this NIC."))
    mtu, want_mtu = nic.get("mtu"), want.get("mtu")
    if want_mtu:
        if mtu != want_mtu:
            out.append(bad("nic.mtu", comp, "fail", "LOCKSTEP_FR_NIC_MTU", "config",
                           f"MTU {mtu}, the fabric uses {want_mtu}: larger packets are dropped on the way.",
                           f"Set the MTU: ip link set dev {nic['device']} mtu {want_mtu} (and in the network "
                           "configuration so it survives a reboot).", {"mtu": mtu}, {"mtu": want_mtu}))
        else:
            out.append(ok("nic.mtu", comp, f"MTU {mtu}.", {"mtu": mtu}, {"mtu": want_mtu}))
    else:
        out.append(skip("nic.mtu", comp, "No expected MTU given; compared across the fleet instead."))
    if want.get("firmware") and nic.get("firmware") and nic["firmware"].split()[0] != want["firmware"]:
        out.append(bad("nic.firmware", comp, "fail", "LOCKSTEP_FR_NIC_FIRMWARE", "config",
                       f"Firmware {nic['firmware']}, {want['firmware']} expected.",
                       "Update the NIC firmware (mlxfwreset/flint or the vendor tool).",
                       {"firmware": nic["firmware"]}, {"firmware": want["firmware"]}))
    limits = COMMON["nic"]
    counters = {k: v for k, v in (nic.get("counters") or {}).items()}
    for key in ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors"):
        counters[key] = ib.get(key)
    flaps = {k: counters[k] for k in ("link_downed", "carrier_changes")
             if counters.get(k) is not None and counters[k] > limits[f"{k}_max"]}
    if flaps:
        out.append(bad("nic.flaps", comp, "warn", "LOCKSTEP_FR_NIC_LINK_FLAPS", "monitor",
                       f"The link went down since boot ({', '.join(f'{k} {v}' for k, v in flaps.items())}).",
                       "Check the cable/optic; a flapping link stalls collectives.", flaps,
                       {k: limits[f"{k}_max"] for k in flaps}))
    errors = {k: counters[k] for k in ("symbol_error", "port_rcv_errors", "rx_errors", "tx_errors", "link_error_recovery")
              if counters.get(k)}
    if errors:
        out.append(bad("nic.errors", comp, "warn", "LOCKSTEP_FR_NIC_ERRORS", "monitor",
                       f"Error counters since boot: {', '.join(f'{k} {v}' for k, v in errors.items())}.",
                       "Watch the counters under load; replace the cable/optic if they grow.", errors,
                       {"symbol_error_max": limits["symbol_error_max"]}))
    if not flaps and not errors:
        out.append(ok("nic.errors", comp, "No link flaps or error counts since boot.", counters))
    return out


def evaluate(nic_facts: dict, *, expected: list[dict] | None = None, mtu: int | None = None,
             speed_mbps: int | None = None, profile: dict) -> list[Result]:
    nics = {n["device"]: n for n in nic_facts.get("nics", [])}
    default_speed = speed_mbps or profile["nic"].get("speed_mbps")
    results: list[Result] = []
    if expected:
        wanted = [(e["device"], {"speed_mbps": e.get("speed_mbps") or default_speed, "mtu": e.get("mtu") or mtu,
                                 "firmware": e.get("firmware")}) for e in expected]
    else:
        wanted = [(name, {"speed_mbps": default_speed if nic.get("rdma_device") else speed_mbps, "mtu": mtu})
                  for name, nic in nics.items() if _physical(nic)]
    for name, want in wanted:
        nic = nics.get(name)
        if nic is None:
            results.append(bad("nic.present", {"kind": "nic", "name": name}, "fail", "LOCKSTEP_FR_NIC_MISSING",
                               "isolate", f"NIC {name} is not present on this node.",
                               "Check the NIC (lspci, dmesg) and its driver; the topology expects it here.",
                               {"present": False}, {"present": True}))
            continue
        results += _one(nic, want)
    audited = [nics[n] for n, _ in wanted if n in nics]
    by_driver: dict[str, set[str]] = {}
    for nic in audited:
        if nic.get("driver") and nic.get("firmware"):
            by_driver.setdefault(nic["driver"], set()).add(nic["firmware"].split()[0])
    for driver, firmwares in sorted(by_driver.items()):
        if len(firmwares) > 1:
            results.append(bad("nic.firmware", {"kind": "host", "name": f"{driver} NICs"}, "warn",
                               "LOCKSTEP_FR_NIC_FIRMWARE_MISMATCH", "config",
                               f"The {driver} NICs of this node run different firmware: {', '.join(sorted(firmwares))}.",
                               "Update every NIC to the same firmware.", {"firmware": sorted(firmwares)}))
    if not wanted:
        results.append(skip("nic.present", {"kind": "host", "name": "NICs"}, "No physical NIC to audit."))
    return results
