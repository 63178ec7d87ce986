"""The `probe.window` telemetry kind: its validator is the agent side's own record check
(workers.probemesh.observations.check_record), its node check refuses a window of a NIC that
is not the posting node's or naming a NIC outside the cluster, and its `file` step files each
record into its cluster window in the batch's transaction (services.add_probe_records); a window
is triangulated once complete."""

from __future__ import annotations

import json

from console.telemetry import kinds
from console.telemetry.kinds import StoredRecords, TelemetryKind
from workers.probemesh.observations import ProbeWindowError, check_record

# A NIC probes at most 512 peers (console.commands.probemesh.MAX_PEERS_PER_NIC): two entries each,
# with a per-path breakdown of lossy pairs. The record's structure is checked field by field
# below; its size as a whole is bounded by its JSON length (one C pass: a 1,024-NIC cluster
# posts a thousand such records a second, and a generic walk of every value costs ten times more).
MAX_RECORD_BYTES = 1024 * 1024
MAX_ENTRIES = 2048
MAX_NAME = 255


def validate_probe_window(data: dict) -> dict:
    try:
        size = len(json.dumps(data, separators=(",", ":"), allow_nan=False))
    except ValueError:
        raise kinds.KindInvalid("", "holds a number that is not finite") from None
    if size > MAX_RECORD_BYTES:
        raise kinds.KindInvalid("", f"is {size} bytes as JSON; at most {MAX_RECORD_BYTES}")
    if isinstance(data.get("probes"), list) and len(data["probes"]) > MAX_ENTRIES:
        raise kinds.KindInvalid("probes", f"has {len(data['probes'])} entries; at most {MAX_ENTRIES}")
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
    kinds.text(MAX_NAME)(data["nic"], "nic")
    for i, entry in enumerate(data["probes"]):
        for key in ("src", "dst"):
            if len(entry[key]) > MAX_NAME or "\x00" in entry[key]:
                raise kinds.KindInvalid(f"probes[{i}].{key}", f"is not a NIC name (at most {MAX_NAME} characters)")
    return data


def nics_of_the_node(node, records: list[tuple[int, dict]]) -> None:
    """A window is the posting node's own NIC's, and names only NICs of its cluster."""
    from console.fleet.models import Nic

    names = dict(Nic.objects.filter(cluster_id=node.cluster_id).values_list("name", "node_id"))
    for i, data in records:
        if names.get(data["nic"]) != node.pk:
            raise kinds.KindInvalid("nic", f"{data['nic']!r} is not a NIC of {node.name}", index=i)
        for k, entry in enumerate(data["probes"]):
            for key in ("src", "dst"):
                if entry[key] not in names:
                    raise kinds.KindInvalid(f"probes[{k}].{key}", f"{entry[key]!r} is not a NIC of the cluster",
                                            index=i)


def _file_into_windows(stored: StoredRecords) -> None:
    from console.incidents import services

    services.add_probe_records(stored)


kinds.register(TelemetryKind(
    name="probe.window",
    description="One NIC's probe window (lockstep.probe.window/v1): sent, lost and one-way delay per peer and "
                "direction; a cluster's records of one window are triangulated together.",
    validate=validate_probe_window,
    check_node=nics_of_the_node,
    file=_file_into_windows,
))
