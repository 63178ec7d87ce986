"""The one writer of clock-sync rows: start and stop it in a cluster, keep the newest pair
estimates, run the network solve and send each node its correction.

The loop: :func:`start` plans a probe graph over the cluster's ready nodes (a ring and chords,
``workers.clocksolve.network.probe_pairs``) and starts the agents' ``clock.sync`` activity with
``activity.set``; every window each agent posts a ``clock.estimate`` record; the kind's handler
stores the pairs (:func:`store_estimates`) and, at most every ``CLOCK_SOLVE_MIN_INTERVAL_S``
per cluster, :func:`solve` brings the newest estimates to one instant, solves the graph, stores
each node's offset, drift and bound, and re-plans the nodes whose correction is due (a new node,
a detected clock step, or ``CLOCK_CORRECT_EVERY_S`` since the last). Services run in the
caller's tenant scope.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from console.clocks.models import ClockState, ClockSync, NodeClock, PairEstimate
from console.commands.services import issue_command
from console.core.errors import Invalid, NotFound
from console.fleet.models import Nic, Node, NodeState
from console.live.publish import publish
from workers.clocksolve.network import BOUND_SIGMAS, probe_pairs, solve_cluster
from workers.clocksolve.network import PairEstimate as Estimate

log = logging.getLogger(__name__)

ACTIVITY = "clock.sync"
# A jump of a node's solved offset beyond its prediction (last offset + drift × elapsed) by this
# much, and by more than 10 bounds, is a clock step: said, counted, and corrected at once.
STEP_MIN_NS = 10_000.0
STEP_BOUNDS = 10.0
# For CLOCK_ESTIMATE_MAX_AGE_S after a step, the solves still mix in estimates from before it (a
# peer's probe window straddling the step, a pair row not yet replaced): the first solve after a
# step sees most of it and the next ones the rest, and the stepped node's neighbours are pulled a
# little. A jump smaller than this fraction of the step (or of a larger jump in the same solve)
# is that rest on the stepped node -- added to its step -- and that pull on the others: neither
# a step nor jitter. (So a step under a tenth of a simultaneous larger one is not told apart.)
STEP_SETTLE_FRACTION = 0.1
JITTER_WEIGHT = 0.2


def _setting(name: str):
    return settings.LOCKSTEP[name]


def probe_address(node: Node) -> str | None:
    """The IPv4 address clock sync probes from: the node's first fabric NIC's (inventory)."""
    nics = Nic.objects.filter(node=node).order_by("-in_topology", "rail", "name")
    for nic in nics:
        for raw in nic.addresses or []:
            try:
                iface = ipaddress.ip_interface(str(raw))
            except ValueError:
                continue
            if iface.version == 4 and not iface.ip.is_loopback:
                return str(iface.ip)
    return None


def start(cluster, *, peers: int = 4, rate_hz: float = 200.0, window_s: float = 2.0) -> ClockSync:
    """Start (or re-plan) clock sync in ``cluster``: every ready node with a fabric address takes part."""
    if not 2 <= peers <= 16:
        raise Invalid("must be in 2..16", field="peers")
    if not 1.0 <= rate_hz <= 2000.0:
        raise Invalid("must be in 1..2000", field="rate_hz")
    if not 0.5 <= window_s <= 30.0:
        raise Invalid("must be in 0.5..30", field="window_s")
    with transaction.atomic():
        sync, _ = ClockSync.objects.select_for_update().get_or_create(
            cluster=cluster, defaults={"organization_id": cluster.organization_id})
        sync.running, sync.peers, sync.rate_hz, sync.window_s = True, peers, rate_hz, window_s
        sync.save()
        replan(sync)
        _publish_sync(sync)
    return sync


def stop(sync: ClockSync) -> None:
    """Stop clock sync in the cluster: the agents stop probing; the rows go."""
    with transaction.atomic():
        for node in Node.objects.filter(cluster_id=sync.cluster_id, name__in=sync.planned):
            issue_command(node, "activity.set", {"name": ACTIVITY, "state": "stopped"})
        PairEstimate.objects.filter(cluster_id=sync.cluster_id).delete()
        NodeClock.objects.filter(cluster_id=sync.cluster_id).delete()
        _publish_sync(sync, stopped=True)
        sync.delete()


def get_sync(cluster_id: int) -> ClockSync:
    sync = ClockSync.objects.filter(cluster_id=cluster_id).first()
    if sync is None:
        raise NotFound("clock sync is not running in this cluster")
    return sync


def _plan_of(sync: ClockSync, node: Node, address: str, peers: list[list[str]], clock: NodeClock | None) -> dict:
    correction = None
    if clock is not None and clock.offset_ns is not None and clock.state in (ClockState.SYNCED, ClockState.REFERENCE):
        correction = {"offset_ns": clock.offset_ns, "drift_ppm": clock.drift_ppm or 0.0,
                      "sigma_ns": clock.sigma_ns or 0.0, "t_ref_ns": clock.t_local_ns,
                      "reference": sync.reference.name if sync.reference else None}
    return {"name": node.name, "address": address, "peers": peers, "rate_hz": sync.rate_hz,
            "window_s": sync.window_s, "correction": correction}


def replan(sync: ClockSync, only: set[str] | None = None) -> list[str]:
    """Send every planned node (or those in ``only``) its plan; re-plans the graph when the node set changed."""
    nodes = {n.name: n for n in Node.objects.filter(cluster_id=sync.cluster_id, state=NodeState.READY)}
    addresses = {name: a for name, n in nodes.items() if (a := probe_address(n)) is not None}
    names = sorted(addresses)
    if names != sorted(sync.planned):
        only = None  # a new graph: everybody gets it
    if sync.reference is None or sync.reference.name not in addresses:
        sync.reference = nodes[names[0]] if names else None
    sync.planned, sync.nodes_total = names, len(names)
    sync.save(update_fields=["planned", "nodes_total", "reference", "updated"])
    neighbours: dict[str, list[str]] = {n: [] for n in names}
    for a, b in probe_pairs(names, sync.peers, seed=sync.cluster_id):
        neighbours[a].append(b)
        neighbours[b].append(a)
    clocks = {c.node_id: c for c in NodeClock.objects.filter(cluster_id=sync.cluster_id)}
    sent = []
    now = timezone.now()
    for name in names:
        if only is not None and name not in only:
            continue
        node = nodes[name]
        clock = clocks.get(node.pk)
        if node.pk == sync.reference_id:
            clock = _reference_clock(sync, node, clock)
        plan = _plan_of(sync, node, addresses[name], [[p, addresses[p]] for p in sorted(neighbours[name])], clock)
        issue_command(node, "activity.set", {"name": ACTIVITY, "args": plan})
        if clock is not None:
            clock.corrected_at, clock.correction = now, plan["correction"]
            clock.save(update_fields=["corrected_at", "correction", "updated"])
        sent.append(name)
    return sent


def _reference_clock(sync: ClockSync, node: Node, clock: NodeClock | None) -> NodeClock:
    """The reference's row: offset 0 by definition (its correction is the identity)."""
    if clock is None:
        clock = NodeClock(organization_id=sync.organization_id, cluster_id=sync.cluster_id, node=node)
    clock.state, clock.offset_ns, clock.drift_ppm, clock.sigma_ns, clock.bound_ns = ClockState.REFERENCE, 0.0, 0.0, 0.0, 0.0
    clock.t_local_ns = clock.t_local_ns or 1
    clock.save()
    _publish_node(clock, node.name)
    return clock


def store_estimates(stored) -> int:
    """Keep the newest estimate of each pair in the records of one batch (the kind's handler)."""
    sync = ClockSync.objects.filter(cluster_id=stored.cluster_id, running=True).first()
    if sync is None:
        return 0
    node = Node.objects.get(pk=stored.node_id)
    peers = {n.name: n for n in Node.objects.filter(cluster_id=stored.cluster_id)}
    count = 0
    with transaction.atomic():
        for record in sorted(stored.records, key=lambda r: r.ts):
            data = record.data
            for pair in data.get("pairs", []):
                peer = peers.get(pair["peer"])
                if peer is None or peer.pk == node.pk:
                    continue
                for member in (node, peer):  # every node clock sync hears of has a row (unsynced until solved)
                    NodeClock.objects.get_or_create(node=member, defaults={
                        "organization_id": member.organization_id, "cluster_id": member.cluster_id})
                PairEstimate.objects.update_or_create(
                    node=node, peer=peer,
                    defaults={"organization_id": node.organization_id, "cluster_id": node.cluster_id,
                              "offset_ns": pair["offset_ns"], "drift_ppm": pair["drift_ppm"],
                              "sigma_ns": max(float(pair["sigma_ns"]), 0.5),
                              "min_owd_ns": pair.get("min_owd_ns"), "probes_used": pair.get("probes_used") or 0,
                              "t_ref_ns": data["t_ref_ns"], "timestamping": str(data.get("timestamping", ""))[:16],
                              "measured_at": record.ts})
                count += 1
    if count and cache.add(f"lockstep:clocks:solve:{stored.cluster_id}", 1,
                           timeout=_setting("CLOCK_SOLVE_MIN_INTERVAL_S")):
        from console.clocks import tasks

        transaction.on_commit(lambda: tasks.solve_clocks.delay(stored.organization_id, stored.cluster_id))
    return count


def solve(cluster_id: int):
    """The network solve over the cluster's newest estimates; stores and publishes it, sends corrections."""
    sync = ClockSync.objects.filter(cluster_id=cluster_id, running=True).select_related("reference").first()
    if sync is None or sync.reference is None:
        return None
    now = timezone.now()
    max_age = timedelta(seconds=_setting("CLOCK_ESTIMATE_MAX_AGE_S"))
    fresh = now - max_age
    rows = list(PairEstimate.objects.filter(cluster_id=cluster_id, measured_at__gte=fresh)
                .select_related("node", "peer"))
    names = sorted(set(sync.planned) | {sync.reference.name})
    nodes = {n.name: n for n in Node.objects.filter(cluster_id=cluster_id, name__in=names)}
    clocks = {c.node_id: c for c in NodeClock.objects.filter(cluster_id=cluster_id)}
    previous = {nodes[name].name: c.offset_ns for name in nodes if (c := clocks.get(nodes[name].pk))
                and c.offset_ns is not None and c.state in (ClockState.SYNCED, ClockState.REFERENCE)}
    estimates = [Estimate(r.node.name, r.peer.name, r.offset_ns, r.drift_ppm, r.sigma_ns, r.t_ref_ns) for r in rows]
    solution = solve_cluster(names, sync.reference.name, estimates, previous)
    due: set[str] = set()
    correct_every = timedelta(seconds=_setting("CLOCK_CORRECT_EVERY_S"))
    jumps = {}
    for name, node in nodes.items():
        clock, corr = clocks.get(node.pk), solution.nodes.get(name)
        if clock is not None and corr is not None and name != sync.reference.name:
            predicted = _predicted(clock, solution.at_ns)
            if predicted is not None:
                jumps[name] = corr.offset_ns - predicted
    recent_steps = [abs(step) for c in clocks.values() if (step := _recent_step(c, now, max_age)) is not None]
    # the scale of the steps in play: recent ones, and jumps in this solve that could be one
    pull_below = STEP_SETTLE_FRACTION * max([0.0, *recent_steps, *(abs(j) for j in jumps.values() if abs(j) > STEP_MIN_NS)])
    with transaction.atomic():
        for name, node in nodes.items():
            clock = clocks.get(node.pk) or NodeClock(organization_id=node.organization_id, cluster_id=cluster_id,
                                                    node=node)
            corr = solution.nodes.get(name)
            if corr is None:
                clock.state = ClockState.ISLAND if name in solution.disconnected and any(
                    name in (e.a, e.b) for e in estimates) else ClockState.UNSYNCED
            else:
                if name in jumps:
                    jump = jumps[name]
                    own_step = _recent_step(clock, now, max_age)
                    threshold = max(STEP_MIN_NS, STEP_BOUNDS * max(corr.bound_ns, clock.bound_ns or 0.0))
                    if own_step is not None and abs(jump) < STEP_SETTLE_FRACTION * abs(own_step):
                        clock.last_step_ns += jump
                        if abs(jump) > STEP_MIN_NS:
                            due.add(name)  # corrected at once, as the step's first part was
                    elif abs(jump) < pull_below:
                        if abs(jump) > threshold:
                            due.add(name)  # pulled by another node's step: corrected, not counted
                    elif abs(jump) > threshold:
                        clock.steps += 1
                        clock.last_step_ns, clock.last_step_at = jump, now
                        due.add(name)
                        log.warning("event=clock_step cluster=%s node=%s step_ns=%.0f", cluster_id, name, jump)
                    else:
                        # what the node serves now (its correction, extrapolated) against this solve
                        served = _served(clock.correction, solution.at_ns)
                        clock.jitter_ns = _jitter(clock.jitter_ns, jump if served is None else corr.offset_ns - served)
                was_synced = clock.state in (ClockState.SYNCED, ClockState.REFERENCE)
                clock.state = ClockState.REFERENCE if name == sync.reference.name else ClockState.SYNCED
                clock.offset_ns, clock.drift_ppm = corr.offset_ns, corr.drift_ppm
                clock.sigma_ns, clock.t_local_ns = corr.sigma_ns, corr.t_local_ns
                # The solve's σ is statistical; how far each solve lands from what the node serves
                # (errors no loop can see, drift error since the correction) widens the bound.
                clock.bound_ns = BOUND_SIGMAS * math.hypot(corr.sigma_ns, clock.jitter_ns or 0.0)
                clock.solved_at = now
                clock.history = [*clock.history, [round(now.timestamp(), 3), round(corr.offset_ns, 1),
                                                  round(clock.bound_ns, 1)]][-NodeClock.HISTORY_MAX:]
                if not was_synced or clock.corrected_at is None or now - clock.corrected_at >= correct_every:
                    due.add(name)
            clock.save()
            clocks[node.pk] = clock
            _publish_node(clock, name)
        by_pair = {(r["a"], r["b"]): r for r in solution.residuals}
        for row in rows:
            res = by_pair.get((row.node.name, row.peer.name))
            row.residual_ns = res["residual_ns"] if res else None
            row.flagged = bool(res and res["flagged"])
            row.save(update_fields=["residual_ns", "flagged", "updated"])
        sync.solved_at = now
        bounds = [c.bound_ns for c in clocks.values() if c.state in (ClockState.SYNCED, ClockState.REFERENCE)]
        sync.worst_bound_ns = max(bounds, default=None)
        sync.nodes_synced = len(solution.nodes)
        sync.flagged, sync.disconnected = solution.flagged[:100], solution.disconnected[:1000]
        sync.noise_scale = solution.noise_scale
        sync.save()
        _publish_sync(sync)
        if due:
            replan(sync, only=due)
    return solution


def _jitter(previous: float | None, residual: float) -> float:
    """RMS of the served-vs-solved residuals, exponentially weighted (the last ~5 solves)."""
    if previous is None:
        return abs(residual)
    return math.sqrt((1 - JITTER_WEIGHT) * previous**2 + JITTER_WEIGHT * residual**2)


def _served(correction: dict | None, at_ns: int) -> float | None:
    """The offset a node serves at the reference instant ``at_ns`` with the correction it was sent."""
    if not correction:
        return None
    since = at_ns - (correction["t_ref_ns"] - correction["offset_ns"])
    return correction["offset_ns"] + correction["drift_ppm"] * 1e-6 * since


def _recent_step(clock: NodeClock, now, max_age: timedelta) -> float | None:
    """The node's last step while the solves may still be settling it (within ``max_age``)."""
    if clock.last_step_at is None or clock.last_step_ns is None or now - clock.last_step_at > max_age:
        return None
    return clock.last_step_ns


def _predicted(clock: NodeClock, at_ns: int) -> float | None:
    """The offset the last solve predicts for the reference instant ``at_ns``."""
    if clock.offset_ns is None or clock.t_local_ns is None or clock.state not in (ClockState.SYNCED,):
        return None
    last_at = clock.t_local_ns - clock.offset_ns
    return clock.offset_ns + (clock.drift_ppm or 0.0) * 1e-6 * (at_ns - last_at)


def sweep(sync: ClockSync) -> None:
    """Periodic: nodes without a fresh estimate are stale; a changed node set gets a new graph."""
    stale_before = timezone.now() - timedelta(seconds=_setting("CLOCK_ESTIMATE_MAX_AGE_S"))
    with transaction.atomic():
        ready = sorted(n.name for n in Node.objects.filter(cluster_id=sync.cluster_id, state=NodeState.READY)
                       if probe_address(n) is not None)
        if ready != sorted(sync.planned):
            replan(sync)
        for clock in NodeClock.objects.filter(cluster_id=sync.cluster_id, state=ClockState.SYNCED,
                                              solved_at__lt=stale_before).select_related("node"):
            clock.state = ClockState.STALE
            clock.save(update_fields=["state", "updated"])
            _publish_node(clock, clock.node.name)


def node_clock_data(clock: NodeClock, name: str) -> dict:
    return {"id": clock.pk, "node": clock.node_id, "name": name, "state": clock.state, "offset_ns": clock.offset_ns,
            "drift_ppm": clock.drift_ppm, "sigma_ns": clock.sigma_ns, "bound_ns": clock.bound_ns,
            "steps": clock.steps, "solved_at": clock.solved_at.isoformat() if clock.solved_at else None}


def _publish_node(clock: NodeClock, name: str) -> None:
    publish(clock.organization_id, clock.cluster_id, "clock.node", node_clock_data(clock, name), key=str(clock.node_id))


def _publish_sync(sync: ClockSync, stopped: bool = False) -> None:
    publish(sync.organization_id, sync.cluster_id, "clock.sync",
            {"cluster": sync.cluster_id, "running": not stopped, "worst_bound_ns": sync.worst_bound_ns,
             "nodes_synced": sync.nodes_synced, "nodes_total": sync.nodes_total,
             "flagged": len(sync.flagged), "disconnected": len(sync.disconnected),
             "solved_at": sync.solved_at.isoformat() if sync.solved_at else None},
            key=str(sync.cluster_id))
