"""Build a realistic fleet for an organization through the same services the API uses."""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from console.audits import services as audit_services
from console.audits.models import AuditRun
from console.clocks import services as clock_services
from console.clocks.models import ClockSync, NodeClock, PairEstimate
from console.commands import services as command_services
from console.commands.models import Command
from console.fleet import services as fleet_services
from console.fleet.models import Cluster, EnrollmentToken, Gpu, Link, Nic, Node, Switch
from console.fleet.services import apply_inventory, enroll, import_topology
from console.incidents import services as incident_services
from console.incidents.models import Incident, ProbeWindow, WindowState
from console.jobs import services as job_services
from console.telemetry import kinds
from console.telemetry.kinds import StoredRecord, StoredRecords
from console.telemetry.models import TelemetryRecord
from console.telemetry.services import ingest


def small_topology(prefix: str = "node") -> dict:
    hosts = [f"{prefix}{i}" for i in range(2)]
    return {
        "format": "lockstep.topology/v1",
        "name": f"{prefix}-fabric",
        "hosts": [{"name": h} for h in hosts],
        "switches": [{"name": "leaf-0", "tier": "leaf"}, {"name": "spine-0", "tier": "spine"}],
        "nics": [{"name": f"{h}/nic0", "host": h, "rail": 0} for h in hosts],
        "links": [{"id": f"{h}/nic0~leaf-0", "a": f"{h}/nic0", "b": "leaf-0"} for h in hosts]
        + [{"id": "leaf-0~spine-0#0", "a": "leaf-0", "b": "spine-0"}],
    }


def make_enrollment_token(cluster: Cluster, **fields) -> str:
    """Minted by the service; `expires`, `revoked_at` or `uses` set afterwards as given (a test
    needs tokens the service would never mint: expired, revoked, used up)."""
    later = {k: fields.pop(k) for k in ("expires", "revoked_at", "uses") if k in fields}
    minted = fleet_services.mint_enrollment_token(cluster, **fields)
    if later:
        EnrollmentToken.objects.filter(pk=minted.token.pk).update(**later)
    return minted.plaintext


def inventory_doc(hostname: str, machine_id: str, gpus: int = 1) -> dict:
    return {
        "format": "lockstep.inventory/v1",
        "collected_at": timezone.now().isoformat(),
        "host": {"hostname": hostname, "machine_id": machine_id, "kernel": "6.1.0", "arch": "x86_64"},
        "gpus": [
            {"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{machine_id}-{i}",
             "pci_bus_id": f"0000:{0x18 + i:02x}:00.0", "memory_bytes": 85520809984, "ecc_enabled": True}
            for i in range(gpus)
        ],
        "nics": [{"device": "nic0", "kind": "ethernet", "mac": "02:00:00:00:00:01", "pci_address": "0000:19:00.0",
                  "speed_mbps": 400000, "mtu": 9000, "link_state": "up", "addresses": ["10.0.0.1/24"]}],
        "affinity": [{"gpu": f"GPU-{machine_id}-0", "nic": "nic0", "relation": "PIX"}] if gpus else [],
        "errors": [],
    }


@dataclass
class Fleet:
    cluster: Cluster
    node: Node
    credential: str
    enrollment_token: EnrollmentToken
    gpu: Gpu
    nic: Nic
    switch: Switch
    link: Link
    command: Command
    record: TelemetryRecord
    audit: AuditRun
    clock_sync: ClockSync
    node_clock: NodeClock
    pair_estimate: PairEstimate


def probe_window(cluster: Cluster, node: Node, start_ns: int) -> dict:
    """A probe.window record of the node's NIC: 30 of 100 probes to another host's NIC lost."""
    nic, peer = f"{node.name}/nic0", next(n for n in Nic.objects.filter(cluster=cluster) if n.node_id != node.pk)
    return {"format": "lockstep.probe.window/v1", "nic": nic, "start_ns": start_ns, "window_s": 1.0,
            "probes": [{"src": nic, "dst": peer.name, "via": "probe", "sent": 100, "lost": 30}], "received": []}


def make_incident(cluster: Cluster, node: Node) -> None:
    """The node's stored probe window filed, a verdict naming the host on it and on the window
    after, the incident they open (then resolved), and the cluster's probe plan (through the incidents services). Where the
    telemetry handlers run at once (a test with transactions), the window has already been filed."""
    rows = list(TelemetryRecord.objects.filter(node=node, kind="probe.window").select_related("batch"))
    stored = kinds.StoredRecords("probe.window", node.organization_id, cluster.pk, node.pk, rows[0].batch_id,
                                 rows[0].batch.seq, tuple(kinds.StoredRecord(r.pk, r.ts, r.data) for r in rows))
    if not ProbeWindow.objects.filter(cluster=cluster).exists():
        incident_services.add_probe_records(stored)
    window = ProbeWindow.objects.get(cluster=cluster)
    if window.state == WindowState.QUEUED:
        verdict = {"format": "lockstep.verdict/v1", "network_ok": True, "culprits": [
            {"kind": "host", "name": node.name, "confidence": 0.97, "evidence": {"loss": {node.name: 0.3}}}]}
        incident_services.record_verdict(window.pk, verdict)
        # a host culprit opens once a second window (evidence of its own) names it too
        second = ProbeWindow.objects.create(organization_id=cluster.organization_id, cluster=cluster,
                                            start_ns=window.start_ns + 10**9, window_s=window.window_s,
                                            expected=window.expected, state=WindowState.QUEUED)
        incident_services.record_verdict(second.pk, verdict)
        # resolved, so the fleet's health stays what the other tests expect
        incident_services.resolve(Incident.objects.get(cluster=cluster))
    incident_services.push_probe_plan(cluster)


def make_fleet(organization, name: str = "cluster") -> Fleet:
    cluster = Cluster.objects.create(organization=organization, name=name)
    prefix = f"{organization.slug}-node"
    import_topology(cluster, small_topology(prefix))
    plaintext = make_enrollment_token(cluster, max_uses=10)
    enrolled = enroll(plaintext, {"hostname": f"{prefix}0", "machine_id": f"{organization.slug}-m0"})
    node = enrolled.node
    apply_inventory(node, inventory_doc(node.name, node.machine_id))
    command, _ = command_services.issue_command(node, "node.health", {})
    clock_sync = clock_services.start(cluster)
    estimate = {"node": node.name, "t_ref_ns": 1_796_403_600_000_000_000, "window_s": 2.0,
                "pairs": [{"peer": f"{prefix}1", "offset_ns": 1830.5, "drift_ppm": 0.41, "sigma_ns": 120.0}]}
    start_ns = int(timezone.now().timestamp()) * 10**9
    ingest(node, {"seq": 1, "records": [{"kind": "node.health", "ts": timezone.now().isoformat(), "data": {"x": 1}},
                                        {"kind": "clock.estimate", "ts": timezone.now().isoformat(), "data": estimate},
                                        {"kind": "probe.window", "ts": start_ns / 1e9 + 1,
                                         "data": probe_window(cluster, node, start_ns)}]}, 100)
    # an audit of the cluster: its one node is still enrolling, so it is not audited (a warning)
    audit, _ = audit_services.start_audit(cluster, options={"load": False})
    audit_services.advance(audit)
    # an hourly audit schedule, so the schedule route has an object to answer with
    audit_services.set_schedule(cluster, interval_s=3600)
    # the clock.estimate handler (it runs after commit, which these tests' transactions never reach)
    record = TelemetryRecord.objects.get(node=node, kind="clock.estimate")
    clock_services.store_estimates(StoredRecords("clock.estimate", organization.pk, cluster.pk, node.pk,
                                                 record.batch_id, 1, (StoredRecord(record.pk, record.ts, record.data),)))
    make_job(node)
    make_incident(cluster, node)
    return Fleet(
        cluster=cluster,
        node=node,
        credential=enrolled.credential,
        enrollment_token=EnrollmentToken.objects.get(cluster=cluster),
        gpu=Gpu.objects.get(node=node),
        nic=Nic.objects.get(node=node, device="nic0"),
        switch=Switch.objects.get(cluster=cluster, name="leaf-0"),
        link=Link.objects.get(cluster=cluster, name="leaf-0~spine-0#0"),
        command=command,
        audit=AuditRun.objects.get(pk=audit.pk),
        record=TelemetryRecord.objects.get(node=node, kind="node.health"),
        clock_sync=clock_sync,
        node_clock=NodeClock.objects.get(node=node),
        pair_estimate=PairEstimate.objects.get(node=node),
    )


def make_job(node: Node, name: str = "train-1") -> None:
    """A job as the node's agent reports it: heartbeat, a snapshot, a checkpoint, a weight
    version, and an NCCL failover on the node (what the telemetry handlers store)."""
    now = timezone.now()
    job_services.record_heartbeat(node, {"job": name, "generation": 0, "ranks": [
        {"rank": 0, "step": 12, "step_time_s": 0.02, "node": 0, "state": "running"}]}, now)
    job_services.record_capture(node, "snapshot", {"job": name, "id": "20261201T000000-000001", "step": 10,
                                                   "bytes": 1024, "paused_s": 0.01, "duration_s": 0.2,
                                                   "path": f"/snapshots/{name}/20261201T000000-000001"}, now)
    job_services.record_capture(node, "checkpoint", {"job": name, "save_id": "s12", "path": f"/ckpt/{name}/12",
                                                     "step": 12, "bytes": 2048, "stall_s": 0.001}, now)
    job_services.record_weight_version(node, {"job": name, "publisher": "f" * 32, "version": 1, "bytes": 4096,
                                              "replicas": {"r0": "ok"}}, now)
    job_services.record_path_event(node, "failover", {"comm": "0x1", "rank": 0, "from": "nic0", "to": "nic1"}, now)
