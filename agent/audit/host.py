"""Host checks on one node: the clock is synchronized, and facts match what the operator expects.

Whether the facts agree *across the fleet* (one kernel, one driver, one NCCL...) is decided by
the console from every node's facts (``workers.audit.fleet``); here a node is only compared with
explicit expectations (``expect``: ``{"kernel": "5.15.0-1042-nvidia", "gpu_driver": "565.57.01",
"hugepages_total": 0, ...}``), when the operator gives some.

Clock: Lockstep's own clock service (the agent's ``time`` answer) decides when the agent has
one; otherwise the kernel's discipline state (``adjtimex``: ``TIME_ERROR`` / ``STA_UNSYNC`` means
no time source has synchronized the clock, as chrony and ntpd report through the kernel).
"""

from __future__ import annotations

from agent.audit.results import Result, bad, ok

MAX_CLOCK_ERROR_US = 100_000  # the kernel's maxerror estimate; NTP marks a clock unusable at 16 s
COMPARABLE = ("kernel", "os", "gpu_driver", "cuda_driver", "cuda_toolkit", "nccl", "hugepages_total",
              "hugepage_size_kb", "transparent_hugepages", "nic_drivers", "nic_firmware", "gpu_models", "gpu_count",
              "cpu_model", "cpu_count", "memory_bytes")


def evaluate(facts: dict, *, expect: dict | None = None) -> list[Result]:
    comp = {"kind": "host", "name": facts.get("hostname") or "host"}
    results: list[Result] = []
    lockstep = facts.get("lockstep_clock")
    kernel = facts.get("clock")
    if lockstep is not None:
        ev = {k: lockstep.get(k) for k in ("synced", "offset_ns", "sigma_ns")}
        if lockstep.get("synced"):
            results.append(ok("host.clock", comp, "Lockstep's clock sync reports this node synchronized.", ev,
                              {"synced": True}))
        else:
            results.append(bad("host.clock", comp, "fail", "LOCKSTEP_FR_CLOCK_UNSYNCED", "config",
                               "Lockstep's clock sync has not synchronized this node.",
                               "Check the clock-sync probes of this node (lockstep agent log).", ev, {"synced": True}))
    elif kernel is None:
        results.append(bad("host.clock", comp, "error", "DCGM_FR_CANNOT_GET_STAT", "triage",
                           "The clock synchronization state could not be read.", "Check the agent's errors."))
    elif not kernel.get("synchronized"):
        results.append(bad("host.clock", comp, "fail", "LOCKSTEP_FR_CLOCK_UNSYNCED", "config",
                           "The system clock is not synchronized to any time source (kernel STA_UNSYNC).",
                           "Run chrony (or ntpd/ptp4l+phc2sys) against the cluster's time servers.", kernel,
                           {"synchronized": True}))
    elif kernel.get("maxerror_us", 0) > MAX_CLOCK_ERROR_US:
        results.append(bad("host.clock", comp, "warn", "LOCKSTEP_FR_CLOCK_ERROR", "monitor",
                           f"The kernel estimates the clock error at up to {kernel['maxerror_us'] / 1000:g} ms.",
                           "Check the time daemon's sources (chronyc sources).", kernel,
                           {"maxerror_us": MAX_CLOCK_ERROR_US}))
    else:
        results.append(ok("host.clock", comp, "The system clock is synchronized.", kernel,
                          {"maxerror_us": MAX_CLOCK_ERROR_US}))
    for key, want in sorted((expect or {}).items()):
        have = facts.get(key)
        if key not in COMPARABLE:
            continue
        if _normal(have) != _normal(want):
            results.append(bad(f"host.{key}", comp, "fail", "LOCKSTEP_FR_HOST_MISMATCH", "config",
                               f"{key} is {have!r}, {want!r} expected.",
                               "Bring this node to the fleet's image (the same packages, driver and kernel).",
                               {key: have}, {key: want}))
        else:
            results.append(ok(f"host.{key}", comp, f"{key} is {have!r}.", {key: have}, {key: want}))
    return results


def _normal(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return tuple(sorted(str(v) for v in value))
    return value
