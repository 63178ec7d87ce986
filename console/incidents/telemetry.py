"""The `probe.window` telemetry kind: its validator is the agent side's own record check
(workers.probemesh.observations.check_record), its node check refuses a window of a NIC that
is not the posting node's or naming a NIC outside the cluster, and its `file` step files each
record into its cluster window in the batch's transaction (services.add_probe_records); a window
is triangulated once complete."""

from __future__ import annotations

from operator import itemgetter

from django.db import connection

from console.core import scoping
from console.telemetry import kinds
from console.telemetry.kinds import StoredRecords, TelemetryKind
from workers.probemesh.observations import ProbeWindowError, check_record

# A NIC probes at most 512 peers (console.commands.probemesh.MAX_PEERS_PER_NIC): two entries each,
# with a per-path breakdown of lossy pairs. The record's structure is checked field by field
# below; its size as a whole is bounded by its JSON length (the kind's `max_bytes`, checked on the
# encoding it is stored with: a 1,024-NIC cluster posts a thousand such records a second, and a
# generic walk of every value costs ten times more).
MAX_RECORD_BYTES = 1024 * 1024
MAX_ENTRIES = 2048
MAX_NAME = 255
_SRC, _DST = itemgetter("src"), itemgetter("dst")


def validate_probe_window(data: dict) -> dict:
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


def cluster_nics(node) -> dict[str, int]:
    """NIC name -> node id of every NIC of the node's cluster. A plain statement (every batch of
    every agent reads it; the ORM's building of it cost more than the database's answer), in the
    node's organization and cluster."""
    scoping.require_writable(node.organization_id, "checking a telemetry batch against its cluster's NICs")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, node_id FROM fleet_nic WHERE organization_id = %s AND cluster_id = %s",
                       [node.organization_id, node.cluster_id])
        return dict(cursor.fetchall())


def nics_of_the_node(node, records: list[tuple[int, dict]]) -> None:
    """A window is the posting node's own NIC's, and names only NICs of its cluster."""
    names = cluster_nics(node)
    known = names.keys()
    for i, data in records:
        if names.get(data["nic"]) != node.pk:
            raise kinds.KindInvalid("nic", f"{data['nic']!r} is not a NIC of {node.name}", index=i)
        probes = data["probes"]
        if known >= set(map(_SRC, probes)) and known >= set(map(_DST, probes)):
            continue  # every name known (the set operations run in C); else find the first that is not
        for k, entry in enumerate(probes):
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
    max_bytes=MAX_RECORD_BYTES,
))
