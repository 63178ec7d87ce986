"""The `probe.window` telemetry kind: its validator is the agent side's own record check
(workers.probemesh.observations.check_record), and its handler files each record into its
cluster window (services.add_probe_records), which is triangulated once complete."""

from __future__ import annotations

from console.telemetry import kinds
from console.telemetry.kinds import StoredRecords, TelemetryKind
from workers.probemesh.observations import ProbeWindowError, check_record

# A NIC probes at most 512 peers (console.commands.probemesh.MAX_PEERS_PER_NIC): two entries each,
# with a per-path breakdown of lossy pairs.
PROBE_WINDOW_LIMITS = kinds.bounded(max_bytes=1024 * 1024, max_depth=8, max_keys=64, max_items=2048,
                                    max_string=256)


def validate_probe_window(data: dict) -> dict:
    PROBE_WINDOW_LIMITS(data, "")
    try:
        check_record(data)
    except ProbeWindowError as exc:
        where, _, problem = str(exc).partition(": ")
        raise kinds.KindInvalid(where.removeprefix("data").lstrip("."), problem) from None
    if type(data["start_ns"]) is not int or data["start_ns"] <= 0:
        raise kinds.KindInvalid("start_ns", f"must be a positive integer (ns), got {data['start_ns']!r}")
    window = data["window_s"]
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0.05 <= window <= 60:
        raise kinds.KindInvalid("window_s", f"must be a number of seconds in 0.05..60, got {window!r}")
    kinds.text(255)(data["nic"], "nic")
    return data


def _file_into_windows(stored: StoredRecords) -> None:
    from console.incidents import services

    services.add_probe_records(stored)


kinds.register(TelemetryKind(
    name="probe.window",
    description="One NIC's probe window (lockstep.probe.window/v1): sent, lost and one-way delay per peer and "
                "direction; a cluster's records of one window are triangulated together.",
    validate=validate_probe_window,
    handlers=[_file_into_windows],
))
