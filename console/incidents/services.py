"""Incidents' one writer: probe windows as they fill, their triangulation, incidents and their
timeline, the health of the elements they name, and the probe plan pushed to agents.

Flow: the `probe.window` kind's file step files each NIC's record into its cluster window in the
batch's transaction (`add_probe_records`); a window is queued for triangulation when every NIC expected has
reported, or when it is overdue (`OVERDUE_WINDOWS` newer windows have started: a NIC that went
silent does not hold its window back for ever). The Celery task calls `triangulate_window`: the
records of the window, and when windows are short those of the windows just before it (the last
`EVIDENCE_S` of evidence), are merged into arrays of directed pairs (workers.probemesh.merge_records,
what `lockstep.observations/v1` would say, without the document), so short windows name a dark
cable at once and a lossy one as soon as its losses add up; the triangulation
(workers.triangulation) gives the verdict, the tracker (workers.incidents) turns verdicts into
open / update / resolve, and each action writes the incident, its timeline and the element's
health, and publishes them live (an incident's event without the live outbox's coalescing wait).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import math
import threading
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import numpy as np
import orjson
from django.db import connection, transaction
from django.utils import timezone

from console.core import scoping
from console.core.errors import Conflict, Invalid
from console.core.models import Health
from console.fleet.inventory import LINK_HEALTH
from console.fleet.models import Cluster, Link, Nic, Node, NodeState, Switch
from console.fleet.topology_io import export_topology
from console.incidents.models import (
    Incident,
    IncidentEvent,
    IncidentState,
    IncidentTracker,
    ProbePlan,
    ProbeWindow,
    WindowState,
)
from console.live.publish import publish
from console.telemetry.kinds import StoredRecords
from workers.fabric.observations import Window, window_of_arrays
from workers.fabric.topology import parse_topology
from workers.incidents import Hysteresis, Span, step, windows_for
from workers.probemesh.observations import Pairs, merge_records
from workers.probeplan import plan_probes
from workers.triangulation import FabricModel, pairs_through, triangulate

log = logging.getLogger(__name__)

OVERDUE_WINDOWS = 2  # a window still filling when this many newer ones have started is triangulated as is
PROBE_WINDOW_RETENTION_S = 3600  # windows (and their verdicts) kept per cluster
MAX_TIMELINE_POINTS = 600  # per incident: one point per window naming it, the newest kept
MAX_EVIDENCE_PAIRS = 64  # per incident: the affected pairs, lossiest first
MAX_SUMMARY_PAIRS = 256  # per window: the lossiest pairs (the heat map's data)
HYSTERESIS = Hysteresis()
# Each window is judged on the evidence of about this long: the window and the ones just before
# it (1 s windows: the window alone). 5 % loss on a cable is a handful of probes per pair in one
# 250 ms window, and unmistakable in four.
EVIDENCE_S = 1.0
# Windows that start this soon after a plan push are not tracked: agents take up a plan one by
# one, and a NIC that has not yet started answering looks like a dead one.
PLAN_SETTLE_S = 5.0
DOWN_LOSS = 0.5  # a culprit losing at least this much is drawn down, below it degraded


# --- filing records into windows ---------------------------------------------------------------


def expected_nics(cluster_id: int) -> int:
    """How many NICs report each window: those of the plan last pushed; without one (agents
    probing on a plan from elsewhere), the topology's NICs on ready nodes."""
    plan = ProbePlan.objects.filter(cluster_id=cluster_id).first()
    if plan is not None and plan.nics:
        return plan.nics
    return Nic.objects.filter(cluster_id=cluster_id, in_topology=True, node__state=NodeState.READY).count()


def add_probe_records(stored: StoredRecords) -> list[int]:
    """File a batch's probe.window records into their cluster windows; returns the ids of the
    windows this queued for triangulation (each record is of the node's own NIC: its kind's
    node check refused the batch otherwise). The kind's `file` step: it runs in the batch's
    transaction, so a batch and its windows' counts are one commit. A window's count is taken
    by one UPDATE ... RETURNING (its row lock orders concurrent batches; no read first), and the
    batch that completes it is the one whose conditional update moves it to queued."""
    by_start: dict[int, list] = {}
    for record in stored.records:
        by_start.setdefault(record.data["start_ns"], []).append(record)
    if not by_start:
        return []
    scoping.require_writable(stored.organization_id, "filing probe records into their windows")
    queued: list[int] = []
    reports: list[tuple[int, int, str]] = []
    started = False
    with transaction.atomic(savepoint=False):
        for start_ns, records in sorted(by_start.items()):
            counted = _count_reports(stored.organization_id, stored.cluster_id, start_ns, len(records))
            if counted is None:  # the window's first batch: how many NICs it waits for is counted once
                window, created = ProbeWindow.objects.get_or_create(
                    cluster_id=stored.cluster_id, start_ns=start_ns,
                    defaults={"organization_id": stored.organization_id, "window_s": records[0].data["window_s"],
                              "expected": expected_nics(stored.cluster_id), "reported": len(records)})
                started |= created
                counted = (window.pk, window.reported, window.expected, window.state) if created else \
                    _count_reports(stored.organization_id, stored.cluster_id, start_ns, len(records))
            window_id, reported, expected, state = counted
            if state == WindowState.FILLING and reported >= max(1, expected) and ProbeWindow.objects.filter(
                    pk=window_id, state=WindowState.FILLING).update(state=WindowState.QUEUED):
                queued.append(window_id)
            reports += [(window_id, record.id, record.data["nic"]) for record in records]
        _insert_reports(stored.organization_id, stored.cluster_id, reports)
        if started:  # a newer window may make older ones overdue
            queued += _queue_overdue(stored.cluster_id, max(by_start))
    for window_id in queued:
        _enqueue(stored.organization_id, window_id)
    return queued


def _count_reports(organization_id: int, cluster_id: int, start_ns: int, n: int) -> tuple | None:
    """Add `n` reports to the cluster's window starting at `start_ns`: (id, reported, expected,
    state) after, or None when there is no such window yet. Scoped by its organization and
    cluster in the statement itself (the ORM's update returns no row)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE incidents_probewindow SET reported = reported + %s "
                       "WHERE organization_id = %s AND cluster_id = %s AND start_ns = %s "
                       "RETURNING id, reported, expected, state", [n, organization_id, cluster_id, start_ns])
        return cursor.fetchone()


_INSERT_REPORTS = ("INSERT INTO incidents_probereport (created, updated, organization_id, cluster_id, window_id, "
                   "record_id, nic) VALUES ")
_REPORT_ROW = "(%s, %s, %s, %s, %s, %s, %s)"
_REPORTS_PER_INSERT = 140  # seven parameters a row: within SQLite's 999 on old builds


def _insert_reports(organization_id: int, cluster_id: int, reports: list[tuple[int, int, str]]) -> None:
    """The ProbeReport rows (window id, record id, NIC) of a batch, in the batch's organization
    and cluster: the windows are those its count matched there, the records the batch's own."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        for start in range(0, len(reports), _REPORTS_PER_INSERT):
            chunk = reports[start:start + _REPORTS_PER_INSERT]
            params = []
            for window_id, record_id, nic in chunk:
                params += [now, now, organization_id, cluster_id, window_id, record_id, nic]
            cursor.execute(_INSERT_REPORTS + ", ".join([_REPORT_ROW] * len(chunk)), params)


def _queue_overdue(cluster_id: int, newest_start_ns: int) -> list[int]:
    queued = []
    for window in ProbeWindow.objects.filter(cluster_id=cluster_id, state=WindowState.FILLING,
                                             start_ns__lt=newest_start_ns).only("id", "start_ns", "window_s"):
        overdue = window.start_ns + OVERDUE_WINDOWS * window.window_s * 1e9 <= newest_start_ns
        if overdue and ProbeWindow.objects.filter(pk=window.pk, state=WindowState.FILLING).update(
                state=WindowState.QUEUED):
            queued.append(window.pk)
    return queued


def queue_stale_windows(now: datetime | None = None) -> list[int]:
    """Windows still filling long after they ended (every agent went quiet): queue them (the
    periodic sweep, in the caller's scope)."""
    now = now or timezone.now()
    queued = []
    for window in ProbeWindow.objects.filter(state=WindowState.FILLING,
                                             created__lt=now - timedelta(seconds=5)):
        if ProbeWindow.objects.filter(pk=window.pk, state=WindowState.FILLING).update(state=WindowState.QUEUED):
            queued.append(window.pk)
            _enqueue(window.organization_id, window.pk)
    return queued


def _enqueue(organization_id: int, window_id: int) -> None:
    from console.incidents.tasks import triangulate_probe_window

    transaction.on_commit(lambda: triangulate_probe_window.delay(organization_id, window_id))


# --- triangulation ----------------------------------------------------------------------------

_models: dict[tuple[int, str], FabricModel] = {}
_models_lock = threading.Lock()


def fabric_model(cluster: Cluster) -> FabricModel:
    """The cluster's FabricModel, kept across windows until its topology is imported again."""
    key = (cluster.pk, cluster.topology_imported_at.isoformat() if cluster.topology_imported_at else "")
    with _models_lock:
        model = _models.get(key)
    if model is None:
        model = FabricModel(parse_topology(export_topology(cluster)))
        with _models_lock:
            for stale in [k for k in _models if k[0] == cluster.pk]:
                del _models[stale]
            _models[key] = model
    return model


# The window's records, each a NIC's newest of those its own node posted (a record of a NIC that
# moved to another node since is left out), in one plain statement in the window's organization
# and cluster: the task's largest cost was Django decoding each record's JSON with json; orjson
# decodes the stored text at about twice its speed.
_WINDOW_RECORDS = ("SELECT p.nic, r.data FROM incidents_probereport p "
                   "JOIN telemetry_telemetryrecord r ON r.id = p.record_id AND r.organization_id = p.organization_id "
                   "JOIN fleet_nic n ON n.organization_id = p.organization_id AND n.cluster_id = p.cluster_id "
                   "AND n.name = p.nic AND n.node_id = r.node_id "
                   "WHERE p.organization_id = %s AND p.cluster_id = %s AND p.window_id = %s ORDER BY r.ts, r.id")


def _window_records(window: ProbeWindow) -> list[dict]:
    """The window's probe.window records, one per NIC (a NIC's newest, should it report twice)."""
    scoping.require_writable(window.organization_id, "reading a probe window's records")
    with connection.cursor() as cursor:
        cursor.execute(_WINDOW_RECORDS, [window.organization_id, window.cluster_id, window.pk])
        by_nic = dict(cursor.fetchall())
    return [orjson.loads(data) if isinstance(data, (str, bytes)) else data for data in by_nic.values()]


def _known_pairs(pairs: Pairs, model: FabricModel) -> tuple[Pairs, Window, int]:
    """The merged pairs between NICs of the topology (as arrays), their Window for the
    triangulation (row i is pair i), and how many pairs naming other NICs were left out. The
    records were checked as they arrived (the kind's validator): they are merged as stored."""
    nic_index = model.index.nic_index
    at = np.array([nic_index.get(name, -1) for name in pairs.names], dtype=np.int64)
    src, dst = at[pairs.src], at[pairs.dst]
    known = np.flatnonzero((src >= 0) & (dst >= 0))
    ignored = len(pairs) - len(known)
    if ignored:
        pairs, src, dst = pairs.take(known), src[known], dst[known]
    return pairs, window_of_arrays(model.index, src, dst, pairs.sent, pairs.lost, pairs.p50, pairs.p99,
                                   pairs.path, window_s=pairs.window_s), ignored


def _pair_row(pairs: Pairs, i: int, share: float | None = None) -> dict:
    sent, lost = int(pairs.sent[i]), int(pairs.lost[i])
    row = {"src": pairs.names[pairs.src[i]], "dst": pairs.names[pairs.dst[i]], "sent": sent, "lost": lost,
           "loss": round(lost / sent, 4) if sent else 0.0}
    if not math.isnan(pairs.p50[i]):
        row["p50_us"], row["p99_us"] = float(pairs.p50[i]), float(pairs.p99[i])
    if share is not None:
        row["share"] = round(float(share), 3)
    return row


def _summary(pairs: Pairs, ignored: int) -> dict:
    sent, lost = int(pairs.sent.sum()), int(pairs.lost.sum())
    lossy = np.flatnonzero(pairs.lost > 0)
    worst = lossy[np.lexsort((pairs.dst[lossy], pairs.src[lossy], -pairs.lost[lossy] / pairs.sent[lossy]))]
    return {"pairs": len(pairs), "sent": sent, "lost": lost, "loss": round(lost / sent, 6) if sent else 0.0,
            "ignored_pairs": ignored, "lossy_pairs": len(lossy),
            "worst": [_pair_row(pairs, int(i)) for i in worst[:MAX_SUMMARY_PAIRS]]}


def triangulate_window(window_id: int) -> ProbeWindow | None:
    """Triangulate one queued window and apply what its verdict means (in the window's
    organization). Windows of a cluster are tracked in order: one older than the newest tracked
    is triangulated and stored, and changes no incident."""
    return _settle(window_id, lambda model, observed: triangulate(model, observed).to_document(evidence=True),
                   accumulate=True)


def record_verdict(window_id: int, verdict: dict) -> ProbeWindow | None:
    """Apply a verdict reached elsewhere (`python -m workers.triangulation` on the window, a
    replay) to a queued window, as its triangulation would (the verdict is of that window alone)."""
    return _settle(window_id, lambda model, observed: verdict, accumulate=False)


def _earlier_windows(window: ProbeWindow, settled_ns: int) -> list[ProbeWindow]:
    """The windows of the same length just before this one that belong in its evidence span,
    oldest first: whatever their triangulation (one skipped, or still queued, is evidence too),
    except a failed one and those before `settled_ns` (agents were taking up a new plan)."""
    n = windows_for(EVIDENCE_S, window.window_s)
    if n == 1:
        return []
    length_ns = int(round(window.window_s * 1e9))
    return list(ProbeWindow.objects.filter(
        cluster_id=window.cluster_id, start_ns__gte=max(settled_ns, window.start_ns - (n - 1) * length_ns),
        start_ns__lt=window.start_ns, window_s__gt=window.window_s - 1e-6, window_s__lt=window.window_s + 1e-6,
    ).exclude(state=WindowState.FAILED).only("id", "cluster_id", "start_ns", "window_s").order_by("start_ns"))


def _superseded(window: ProbeWindow) -> bool:
    """Whether a newer window of the cluster is complete (queued or done) already: the console
    is behind, and the newer one's verdict, whose span holds this one's records, is what counts."""
    return ProbeWindow.objects.filter(cluster_id=window.cluster_id, start_ns__gt=window.start_ns,
                                      state__in=[WindowState.QUEUED, WindowState.DONE]).exists()


def _settle(window_id: int, judge, accumulate: bool) -> ProbeWindow | None:
    window = ProbeWindow.objects.filter(pk=window_id).select_related("cluster").first()
    if window is None or window.state != WindowState.QUEUED:
        return window
    cluster = window.cluster
    plan = ProbePlan.objects.filter(cluster=cluster).only("pushed_at").first()
    settled_ns = int((plan.pushed_at.timestamp() + PLAN_SETTLE_S) * 1e9) if plan is not None and plan.pushed_at else 0
    if accumulate and window.start_ns >= settled_ns and windows_for(EVIDENCE_S, window.window_s) > 1 \
            and _superseded(window):
        # behind (a loaded console): short windows are skipped for the newest complete one,
        # which is judged on their records too, so the delay does not grow with the backlog
        if ProbeWindow.objects.filter(pk=window.pk, state=WindowState.QUEUED).update(
                state=WindowState.LATE, summary={"skipped": "a newer window was complete"},
                triangulated_at=timezone.now()):
            window.state = WindowState.LATE
        return window
    # The verdict is reached before the write transaction: SQLite has one writer, and the
    # records agents post meanwhile must not wait for a triangulation to file theirs.
    error = None
    earlier: list[ProbeWindow] = []
    try:
        model = fabric_model(cluster)
        records = _window_records(window)
        pairs, observed, ignored = _known_pairs(merge_records(records), model)
        earlier = _earlier_windows(window, settled_ns) if accumulate else []
        if earlier:  # the span: this window's records and those of the windows before it
            spanned = [r for w in earlier for r in _window_records(w)] + records
            evidence_pairs, evidence, _ = _known_pairs(merge_records(spanned), model)
        else:
            evidence_pairs, evidence = pairs, observed
        verdict = judge(model, evidence)
    except (ValueError, KeyError) as exc:  # ObservationsError, ProbeWindowError, TopologyError
        error = exc
    with transaction.atomic():
        tracker, _ = IncidentTracker.objects.select_for_update().get_or_create(
            cluster=cluster, defaults={"organization_id": cluster.organization_id})
        window = ProbeWindow.objects.select_for_update().get(pk=window_id)
        if window.state != WindowState.QUEUED:  # another worker settled it meanwhile
            return window
        if error is not None:
            window.state, window.error = WindowState.FAILED, str(error)[:1000]
            window.triangulated_at = timezone.now()
            window.save(update_fields=["state", "error", "triangulated_at", "updated"])
            log.warning("event=probe_window_failed cluster=%s start_ns=%s error=%s", cluster.pk, window.start_ns,
                        error)
            return window
        window.verdict, window.network_ok = verdict, verdict["network_ok"]
        window.summary = _summary(pairs, ignored)
        from_ns = earlier[0].start_ns if earlier else window.start_ns
        window.summary["evidence"] = {"windows": len(earlier) + 1, "from_start_ns": from_ns}
        window.triangulated_at = timezone.now()
        if window.start_ns <= tracker.last_start_ns:
            window.state = WindowState.LATE
        elif window.start_ns < settled_ns:
            window.state = WindowState.SETTLING
        else:
            window.state = WindowState.DONE
            judged = Span(window.start_ns, window.start_ns + int(round(window.window_s * 1e9)), from_ns)
            tracker.state, actions = step(tracker.state, judged, verdict["culprits"], HYSTERESIS)
            tracker.last_start_ns = window.start_ns
            tracker.save(update_fields=["state", "last_start_ns", "updated"])
            for action in actions:
                _apply(cluster, window, action, model, evidence, evidence_pairs, from_ns)
        window.save(update_fields=["verdict", "network_ok", "summary", "triangulated_at", "state", "updated"])
        publish(cluster.organization_id, cluster.pk, "probe_window",
                {"id": window.pk, "start_ns": window.start_ns, "window_s": window.window_s,
                 "evidence_windows": len(earlier) + 1, "network_ok": window.network_ok,
                 "culprits": [{k: c[k] for k in ("kind", "name", "confidence")} for c in verdict["culprits"]],
                 "pairs": window.summary["pairs"], "loss": window.summary["loss"]}, key="latest")
    expired = ProbeWindow.objects.filter(cluster=cluster,
                                         start_ns__lt=window.start_ns - int(PROBE_WINDOW_RETENTION_S * 1e9))
    if expired.exists():  # a read first: a delete is a write transaction even when nothing goes
        expired.delete()
    return window


def _window_time(window: ProbeWindow) -> datetime:
    return datetime.fromtimestamp((window.start_ns / 1e9) + window.window_s, tz=dt_timezone.utc)


def _culprit_loss(culprit: dict) -> float | None:
    losses = culprit.get("evidence", {}).get("loss", {})
    return round(max(losses.values()), 6) if losses else None


def _evidence(model: FabricModel, observed: Window, pairs: Pairs, culprit: dict, previous: ProbeWindow | None) -> dict:
    """The pairs whose probes can cross the culprit, lossiest first, during the evidence span
    (`pairs`) and in the window before it."""
    try:
        rows, share = pairs_through(model, observed, culprit["kind"], culprit["name"])
    except KeyError:
        return {}
    during = sorted((_pair_row(pairs, int(r), s) for r, s in zip(rows, share, strict=True)),
                    key=lambda p: (-p["loss"], -p.get("p99_us", 0), p["src"], p["dst"]))[:MAX_EVIDENCE_PAIRS]
    before_by_pair = {}
    if previous is not None and previous.summary:
        before_by_pair = {(p["src"], p["dst"]): p for p in previous.summary.get("worst", [])}
    before = [before_by_pair.get((p["src"], p["dst"]), {"src": p["src"], "dst": p["dst"], "loss": 0.0})
              for p in during]
    return {"window_start_ns": pairs.start_ns, "pairs_crossing": len(rows), "during": during,
            "before": before, "before_window_start_ns": previous.start_ns if previous else None,
            "culprit": {k: v for k, v in culprit.items() if k != "name"}}


def _apply(cluster: Cluster, window: ProbeWindow, action, model: FabricModel, observed: Window, pairs: Pairs,
           from_ns: int) -> None:
    kind, name = action.key.split(":", 1)
    seen = _window_time(window)
    incident = (Incident.objects.filter(cluster=cluster, kind=kind, culprit=name)
                .exclude(state=IncidentState.RESOLVED).order_by("-opened_at").first())
    if action.action == "resolve":
        if incident is not None:
            _resolve(incident, seen, f"the culprit was not named for {HYSTERESIS.clear_s:g} s")
        return
    culprit = action.culprit
    loss = _culprit_loss(culprit)
    if incident is None:
        previous = (ProbeWindow.objects.filter(cluster=cluster, start_ns__lt=from_ns,
                                               state__in=[WindowState.DONE, WindowState.LATE, WindowState.SETTLING])
                    .order_by("-start_ns").first())
        evidence = _evidence(model, observed, pairs, culprit, previous)
        last = (Incident.objects.filter(cluster=cluster, kind=kind, culprit=name, state=IncidentState.RESOLVED)
                .order_by("-resolved_at").first()) if action.action == "reopen" else None
        if last is not None:
            incident = last
            incident.state, incident.resolved_at, incident.resolved_by = IncidentState.OPEN, None, None
            incident.reopened += 1
            event = "reopened"
        else:
            incident = Incident(organization_id=cluster.organization_id, cluster=cluster, kind=kind, culprit=name,
                                network_ok=kind == "host", first_seen=seen)
            event = "opened"
        incident.confidence, incident.loss, incident.last_seen = culprit["confidence"], loss, seen
        incident.windows += 1
        incident.evidence = evidence
        incident.save()
        _timeline(incident, event, seen, culprit["confidence"], loss, {"window_start_ns": window.start_ns})
        _set_health(incident, _incident_health(incident))
    else:
        incident.confidence, incident.loss, incident.last_seen = culprit["confidence"], loss, seen
        incident.windows += 1
        incident.save(update_fields=["confidence", "loss", "last_seen", "windows"])
    _timeline(incident, "window", seen, culprit["confidence"], loss,
              {"window_start_ns": window.start_ns, "loss": culprit.get("evidence", {}).get("loss", {}),
               "delay": {k: v for k, v in culprit.get("evidence", {}).items() if k not in ("loss", "pairs", "nics")}})
    _publish(incident)


def _timeline(incident: Incident, kind: str, ts: datetime, confidence: float | None, loss: float | None,
              data: dict) -> None:
    IncidentEvent.objects.create(organization_id=incident.organization_id, cluster_id=incident.cluster_id,
                                 incident=incident, ts=ts, kind=kind, confidence=confidence, loss=loss, data=data)
    if kind == "window":
        points = IncidentEvent.objects.filter(incident=incident, kind="window")
        if points.count() > MAX_TIMELINE_POINTS:
            oldest = points.order_by("-ts", "-id").values_list("id", flat=True)[MAX_TIMELINE_POINTS:]
            IncidentEvent.objects.filter(pk__in=list(oldest)).delete()


# --- element health ---------------------------------------------------------------------------

_ELEMENTS = {"link": Link, "switch": Switch, "nic": Nic}
_WORSE = {Health.UNKNOWN: 0, Health.OK: 1, Health.DEGRADED: 2, Health.DOWN: 3}


def _incident_health(incident: Incident) -> str:
    return Health.DOWN if incident.loss is not None and incident.loss >= DOWN_LOSS else Health.DEGRADED


def _set_health(incident: Incident, health: str) -> None:
    """The culprit element's health (a host has none of its own: the status JSON overlays its
    open incidents on its node), published for the map."""
    model = _ELEMENTS.get(incident.kind)
    if model is not None:
        model.objects.filter(cluster_id=incident.cluster_id, name=incident.culprit).update(health=health)
    publish(incident.organization_id, incident.cluster_id, "element",
            {"kind": incident.kind, "name": incident.culprit, "health": health}, key=f"{incident.kind}:{incident.culprit}")


def _healthy_again(incident: Incident) -> str:
    if incident.kind == "nic":
        nic = Nic.objects.filter(cluster_id=incident.cluster_id, name=incident.culprit).first()
        return LINK_HEALTH.get(nic.link_state, Health.UNKNOWN) if nic else Health.UNKNOWN
    return Health.OK


def open_incident_health(cluster_id: int) -> dict[tuple[str, str], str]:
    """(kind, name) -> the health the cluster's open incidents give their culprits."""
    out: dict[tuple[str, str], str] = {}
    for incident in Incident.objects.filter(cluster_id=cluster_id).exclude(state=IncidentState.RESOLVED):
        key, health = (incident.kind, incident.culprit), _incident_health(incident)
        if _WORSE[health] > _WORSE.get(out.get(key, Health.UNKNOWN), 0):
            out[key] = health
    return out


def open_incidents(cluster_id: int) -> list[dict]:
    """The cluster's open incidents, as the status JSON lists them (newest first, bounded)."""
    rows = (Incident.objects.filter(cluster_id=cluster_id).exclude(state=IncidentState.RESOLVED)
            .order_by("-last_seen").values("id", "kind", "culprit", "state", "network_ok", "confidence", "loss",
                                          "first_seen", "last_seen")[:100])
    return [{**r, "first_seen": r["first_seen"].isoformat(), "last_seen": r["last_seen"].isoformat()} for r in rows]


def worse(a: str, b: str | None) -> str:
    return b if b is not None and _WORSE[b] > _WORSE[a] else a


# --- operators' actions -----------------------------------------------------------------------


def acknowledge(incident: Incident, user=None) -> Incident:
    if incident.state == IncidentState.RESOLVED:
        raise Conflict("the incident is resolved; nothing to acknowledge")
    if incident.state == IncidentState.ACKNOWLEDGED:
        return incident
    with transaction.atomic():
        now = timezone.now()
        incident.state, incident.acknowledged_at = IncidentState.ACKNOWLEDGED, now
        incident.acknowledged_by = user if user is not None and user.is_authenticated else None
        incident.save(update_fields=["state", "acknowledged_at", "acknowledged_by"])
        _timeline(incident, "acknowledged", now, None, None,
                  {"by": getattr(incident.acknowledged_by, "username", None)})
        _publish(incident)
    return incident


def resolve(incident: Incident, user=None) -> Incident:
    """An operator resolves the incident; the tracker forgets its culprit, so a fault still there
    reopens it after the windows it takes to open."""
    if incident.state == IncidentState.RESOLVED:
        raise Conflict("the incident is already resolved")
    with transaction.atomic():
        tracker = IncidentTracker.objects.select_for_update().filter(cluster_id=incident.cluster_id).first()
        key = f"{incident.kind}:{incident.culprit}"
        if tracker is not None and key in tracker.state.get("culprits", {}):
            tracker.state["culprits"].pop(key)
            tracker.state.setdefault("resolved", {})[key] = tracker.last_start_ns
            tracker.save(update_fields=["state"])
        incident.resolved_by = user if user is not None and user.is_authenticated else None
        _resolve(incident, timezone.now(), f"resolved by {getattr(incident.resolved_by, 'username', 'an operator')}")
    return incident


def _resolve(incident: Incident, at: datetime, why: str) -> None:
    incident.state, incident.resolved_at = IncidentState.RESOLVED, at
    incident.save(update_fields=["state", "resolved_at", "resolved_by"])
    _timeline(incident, "resolved", at, None, None, {"why": why})
    _set_health(incident, _healthy_again(incident))
    _publish(incident)


def _publish(incident: Incident) -> None:
    publish(incident.organization_id, incident.cluster_id, "incident", {
        "id": incident.pk, "kind": incident.kind, "culprit": incident.culprit, "state": incident.state,
        "network_ok": incident.network_ok, "confidence": round(incident.confidence, 4), "loss": incident.loss,
        "first_seen": incident.first_seen.isoformat(), "last_seen": incident.last_seen.isoformat(),
        "windows": incident.windows,
    }, key=str(incident.pk), prompt=True)


# --- the probe plan ---------------------------------------------------------------------------

PLAN_OPTIONS = ("interval_ms", "window_ms", "port", "sport_first", "sport_count", "deadline_floor_ms", "paths")


def _ipv4(addresses) -> str | None:
    for a in addresses or []:
        try:
            iface = ipaddress.ip_interface(str(a))
        except ValueError:
            continue
        if iface.version == 4 and not iface.ip.is_loopback and not iface.ip.is_link_local:
            return str(iface.ip)
    return None


def plan_arguments(cluster: Cluster, options: dict | None = None) -> tuple[dict[int, dict], dict]:
    """The probe.mesh plan of each ready node (by node id), from the cluster's topology and the
    NICs its agents reported addresses for; and a description (members, pairs, skipped)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(PLAN_OPTIONS))
    if unknown:
        raise Invalid(f"unknown plan option {unknown[0]!r} (known: {', '.join(PLAN_OPTIONS)})", field=unknown[0])
    nics = list(Nic.objects.filter(cluster=cluster, in_topology=True).select_related("node").order_by("name"))
    members, skipped = {}, []
    for nic in nics:
        address = _ipv4(nic.addresses)
        if nic.node.state != NodeState.READY:
            skipped.append({"nic": nic.name, "why": f"node {nic.node.state}"})
        elif address is None:
            skipped.append({"nic": nic.name, "why": "no IPv4 address reported"})
        else:
            members[nic.name] = (nic, address)
    if not nics:
        return {}, {"members": 0, "pairs": 0, "skipped": skipped}
    plan = plan_probes(parse_topology(export_topology(cluster)), seed=cluster.pk, members=sorted(members))
    per_node: dict[int, dict] = {}
    pairs = 0
    for name, (nic, address) in members.items():
        peers = [[p, members[p][1]] for p in plan.peers.get(name, ()) if p in members]
        pairs += len(peers)
        entry = {"name": name, "address": address, "peers": peers}
        if nic.device:
            entry["interface"] = nic.device
        per_node.setdefault(nic.node_id, {"nics": [], **options})["nics"].append(entry)
    return per_node, {"members": len(members), "pairs": pairs, "skipped": skipped}


def _fingerprint(cluster: Cluster, per_node: dict[int, dict]) -> str:
    doc = {"topology": cluster.topology_imported_at.isoformat() if cluster.topology_imported_at else None,
           "plans": {str(k): v for k, v in sorted(per_node.items())}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def push_probe_plan(cluster: Cluster, *, options: dict | None = None, force: bool = False, user=None) -> ProbePlan:
    """Compute the cluster's probe plan and send each ready node its part (`activity.set` of
    `probe.mesh`), unless the same plan was already pushed (`force` pushes it again)."""
    from console.commands.services import issue_command

    per_node, description = plan_arguments(cluster, options)
    fingerprint = _fingerprint(cluster, per_node)
    with transaction.atomic():
        plan, _ = ProbePlan.objects.select_for_update().get_or_create(
            cluster=cluster, defaults={"organization_id": cluster.organization_id, "fingerprint": ""})
        if plan.fingerprint == fingerprint and not force:
            return plan
        nodes = {n.pk: n for n in Node.objects.filter(pk__in=list(per_node))}
        revision = timezone.now().timestamp()
        for node_id, args in sorted(per_node.items()):
            issue_command(nodes[node_id], "activity.set", {"name": "probe.mesh", "args": args,
                                                            "revision": int(revision * 1e9)}, user=user)
        plan.fingerprint, plan.revision, plan.pushed_at = fingerprint, int(revision * 1e9), timezone.now()
        plan.nics, plan.pairs, plan.nodes = description["members"], description["pairs"], len(per_node)
        plan.skipped = description["skipped"][:1000]
        plan.options = dict(options or {})
        plan.save()
        publish(cluster.organization_id, cluster.pk, "probe_plan",
                {"id": plan.pk, "nics": plan.nics, "pairs": plan.pairs, "nodes": plan.nodes}, key=str(plan.pk))
    return plan


def refresh_probe_plans() -> list[int]:
    """Push the plan of every cluster (in the caller's scope) whose topology or members changed
    since its last push; returns the clusters pushed. Clusters never planned are left alone
    until an operator pushes their first plan (the probe mesh is opted into per cluster)."""
    pushed = []
    for plan in ProbePlan.objects.select_related("cluster"):
        before = plan.fingerprint
        if push_probe_plan(plan.cluster, options=plan.options).fingerprint != before:
            pushed.append(plan.cluster_id)
    return pushed

