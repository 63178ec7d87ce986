"""The audits' one writer: start, advance, cancel and finish audit runs; schedules; gating.

A run is started here (idempotent with a key; refused while another run holds one of its nodes),
then advanced by ``advance(run)``, one step per call, from the audits' Celery tasks:

1. ``nodes``: an ``audit.node`` command per reachable node; a node that is not reachable when the
   run starts is *not audited* (never passed); a node whose check does not answer by the phase's
   deadline fails it, with the reason. Then the fleet agreement of the nodes' host facts
   (``workers.audit.fleet``).
2. ``load`` (when the run covers every host of the cluster's topology and each answered): the
   traffic plan (``workers.trafficplan``) as ``audit.load`` commands that start together at one
   instant of cluster time, planned with a lead for command delivery at this many hosts and a
   load long enough that a late agent is still measured (``workers.trafficplan.timing``), every
   link loaded both ways; each pair measured over the windows both its ends were loading in,
   merged into one observation window and localized by the triangulation (``workers.triangulation``);
   each flow's uplink traced before the load (TTL 2) shows a leaf that does not spread its flows
   over its uplinks (``workers.audit.ecmp``).
3. ``collective`` (``options.collective``, every host answered): the collective bandwidth test
   (``workers.audit.collective``), ``audit.collective`` on every node: each rail at once, then
   across the cluster; bus bandwidth as nccl-tests computes it, against the threshold table of
   the nodes' hardware (NCCL) or ``collective_min_busbw_gbs``.
4. the verdict (``workers.audit.verdict.compose``): findings with their elements, culprits,
   pass / warn / fail. A run started when a node returns from maintenance puts the node back in
   service only when the node passed.

Everything runs in the caller's tenant scope.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from console.audits.models import (
    AuditFinding,
    AuditNode,
    AuditRun,
    AuditSchedule,
    NodeOutcome,
    Phase,
    RunState,
    Trigger,
    Verdict,
)
from console.commands import services as commands
from console.commands.audit import HARDWARE, SECTIONS
from console.commands.models import OPEN_STATES, Command, CommandState
from console.core.errors import Conflict, Invalid
from console.fleet import services as fleet
from console.fleet.models import Cluster, Nic, Node, NodeState
from console.fleet.topology_io import export_topology
from console.live.publish import publish
from workers.audit import ecmp
from workers.audit import fleet as fleet_agreement
from workers.audit.verdict import Missing, compose, fleet_facts, node_status

# States whose agent polls for commands: a node in another state is not audited.
REACHABLE = (NodeState.READY, NodeState.DRAINING)
# After a phase's commands time out, how long the console still waits for a late result.
GRACE_S = 15
MIN_SCHEDULE_INTERVAL_S = 600

# option: (type, default, minimum, maximum, help)
OPTIONS = {
    "sections": (list, list(SECTIONS), None, None, "node checks to run: " + ", ".join(SECTIONS)),
    "hardware": (str, None, None, None, "threshold profile: " + ", ".join(HARDWARE) + " (default: from the GPUs)"),
    "listen_ms": (int, 1000, 0, 30000, "how long each node listens for GPU Xid events"),
    "node_timeout_s": (int, 120, 5, 600, "how long a node has to answer its checks"),
    "load": (bool, True, None, None, "load every link at once (needs every host of the topology)"),
    "load_duration_s": (float, 4.0, 1.0, 120.0, "how long every pair is measured under load (the load runs "
                        "longer, so a late agent is still measured this long)"),
    "load_lead_s": (float, 5.0, 1.0, 60.0, "the least lead of the load's common start (it grows with the "
                    "hosts and the node phase's command delivery)"),
    "rate_mbit": (float, 2.0, 0.1, 10000.0, "offered rate per flow"),
    "flows_per_nic": (int, 8, 1, 64, "flows each NIC sends (and about as many it receives)"),
    "packet_bytes": (int, 1400, 64, 9000, "UDP payload of the load: at the fabric's MTU it finds MTU mismatches"),
    "collective": (bool, False, None, None, "run the collective bandwidth test per rail and across the cluster "
                   "(torch.distributed on every node; needs every host of the topology)"),
    "collective_backend": (str, "gloo", None, None, "torch.distributed backend of the collective: gloo or nccl"),
    "collective_size_bytes": (int, 1 << 20, 1024, 1 << 32, "nccl-tests size of the all_reduce"),
    "collective_iters": (int, 5, 1, 1000, "timed all_reduce iterations (after one warm-up)"),
    "collective_timeout_s": (int, 120, 10, 3600, "how long each collective may run"),
    "collective_min_busbw_gbs": (float, None, 0.0, 100000.0, "bus bandwidth floor (default: the hardware table's "
                                 "per-NIC value with nccl; none with gloo)"),
}


def clean_options(options) -> dict:
    """The run's options with defaults; Invalid names every bad one."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise Invalid("options must be an object.", field="options")
    problems = {f"options.{k}": "unknown option (known: " + ", ".join(OPTIONS) + ")" for k in options if k not in OPTIONS}
    out = {}
    for key, (typ, default, low, high, _) in OPTIONS.items():
        value = options.get(key, default)
        if value is None:
            continue
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            problems[f"options.{key}"] = f"must be {typ.__name__}, not {type(value).__name__}"
            continue
        if low is not None and not low <= value <= high:
            problems[f"options.{key}"] = f"must be between {low} and {high}, not {value}"
        elif key == "sections" and (not value or any(s not in SECTIONS for s in value)):
            problems[f"options.{key}"] = "a non-empty list of " + ", ".join(SECTIONS)
        elif key == "hardware" and value not in HARDWARE:
            problems[f"options.{key}"] = "one of " + ", ".join(HARDWARE)
        elif key == "collective_backend" and value not in ("gloo", "nccl"):
            problems[f"options.{key}"] = "one of gloo, nccl"
        out[key] = value
    if problems:
        raise Invalid("The audit options are not valid: " + "; ".join(f"{k}: {v}" for k, v in problems.items()),
                      fields=problems)
    return out


# --- start, cancel ------------------------------------------------------------------------------

def start_audit(cluster: Cluster, *, node_ids=None, options=None, user=None, idempotency_key: str | None = None,
                trigger: str = Trigger.MANUAL) -> tuple[AuditRun, bool]:
    """Start an audit of the cluster (or of `node_ids`). Returns (run, created): a repeated key
    returns the first run. Conflict while another run holds one of the nodes."""
    options = clean_options(options)
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 100):
        raise Invalid("idempotency_key must be a string of 1..100 characters.", field="idempotency_key")
    if idempotency_key:
        existing = AuditRun.objects.filter(cluster=cluster, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic():
            Cluster.objects.select_for_update().filter(pk=cluster.pk).first()  # one start at a time per cluster
            nodes = _nodes_of(cluster, node_ids)
            _refuse_overlap(cluster, nodes)
            run = AuditRun.objects.create(
                organization_id=cluster.organization_id, cluster=cluster, trigger=trigger, options=options,
                idempotency_key=idempotency_key or None,
                created_by=user if user is not None and user.is_authenticated else None,
            )
            _start_node_phase(run, nodes)
            _publish(run)
    except IntegrityError:
        existing = AuditRun.objects.filter(cluster=cluster, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return existing, False
    transaction.on_commit(lambda: _kick(run))
    return run, True


def _nodes_of(cluster: Cluster, node_ids) -> list[Node]:
    queryset = Node.objects.filter(cluster=cluster).exclude(state=NodeState.RETIRED)
    if node_ids is None:
        nodes = list(queryset.order_by("name"))
        if not nodes:
            raise Invalid("The cluster has no nodes to audit.", field="nodes")
        return nodes
    if not isinstance(node_ids, list) or not node_ids or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                 for i in node_ids):
        raise Invalid("nodes must be a non-empty list of node ids.", field="nodes")
    nodes = list(queryset.filter(pk__in=node_ids).order_by("name"))
    unknown = sorted(set(node_ids) - {n.pk for n in nodes})
    if unknown:
        raise Invalid(f"Not nodes of this cluster: {', '.join(map(str, unknown))}.", field="nodes")
    return nodes


def _refuse_overlap(cluster: Cluster, nodes: list[Node]) -> None:
    busy = (AuditNode.objects.filter(run__cluster=cluster, run__state=RunState.RUNNING, node__in=nodes)
            .select_related("node").order_by("run_id", "node__name"))
    held: dict[int, list[str]] = {}
    for an in busy:
        held.setdefault(an.run_id, []).append(an.node.name)
    if held:
        run_id, names = next(iter(held.items()))
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise Conflict(f"Audit {run_id} is already running on {shown}: wait for it to finish or cancel it.",
                       field="nodes", code="audit_running")


def cancel(run: AuditRun) -> AuditRun:
    """Cancel a running audit and its open commands (Conflict when it has finished)."""
    with transaction.atomic():
        run = AuditRun.objects.select_for_update().get(pk=run.pk)
        if run.state != RunState.RUNNING:
            raise Conflict(f"A {run.state} audit cannot be cancelled.", field="state")
        _cancel_open_commands(run)
        run.state, run.finished_at = RunState.CANCELLED, timezone.now()
        run.save(update_fields=["state", "finished_at", "updated"])
        AuditNode.objects.filter(run=run, outcome=NodeOutcome.PENDING).update(
            outcome=NodeOutcome.NOT_AUDITED, reason="the audit was cancelled")
        _publish(run)
    return run


def _cancel_open_commands(run: AuditRun) -> None:
    ids = [i for pair in AuditNode.objects.filter(run=run).values_list("check_command_id", "load_command_id")
           for i in pair if i] + list(_collective_commands(run))
    for command in Command.objects.filter(pk__in=ids, state__in=OPEN_STATES):
        with contextlib.suppress(Conflict):  # completed meanwhile
            commands.cancel(command)


# --- the node phase -----------------------------------------------------------------------------

def _majority(values) -> int | None:
    counts = Counter(v for v in values if v)
    if not counts:
        return None
    value, count = counts.most_common(1)[0]
    return value if count * 2 > sum(counts.values()) else None


def _fabric_nics(cluster: Cluster) -> dict[int, list[dict]]:
    """Per node, its fabric NICs as the node checks expect them: the topology's NICs, each at the
    MTU and speed most of the fabric's NICs report (an MTU or a speed is the fabric's, not a NIC's)."""
    nics = list(Nic.objects.filter(cluster=cluster, in_topology=True).exclude(device="")
                .values("node_id", "device", "rail", "mtu", "speed_mbps"))
    mtu, speed = _majority(n["mtu"] for n in nics), _majority(n["speed_mbps"] for n in nics)
    out: dict[int, list[dict]] = {}
    for n in nics:
        want = {"device": n["device"], "rail": n["rail"], "mtu": mtu, "speed_mbps": speed}
        out.setdefault(n["node_id"], []).append({k: v for k, v in want.items() if v is not None})
    return out


def _start_node_phase(run: AuditRun, nodes: list[Node]) -> None:
    options = run.options
    args = {"sections": options["sections"], "listen_ms": options["listen_ms"]}
    if options.get("hardware"):
        args["hardware"] = options["hardware"]
    fabric_nics = _fabric_nics(run.cluster)
    rows = []
    for node in nodes:
        row = AuditNode(organization_id=run.organization_id, cluster_id=run.cluster_id, run=run, node=node)
        if node.state not in REACHABLE:
            row.outcome = NodeOutcome.NOT_AUDITED
            seen = f", last seen {node.last_seen:%Y-%m-%d %H:%M:%S} UTC" if node.last_seen else ""
            row.reason = f"unreachable: the node is {node.state}{seen}"
        else:
            node_args = args | ({"nics": fabric_nics[node.pk]} if node.pk in fabric_nics else {})
            command, _ = commands.issue_command(node, "audit.node", node_args, idempotency_key=f"audit-{run.pk}-node",
                                                timeout_s=options["node_timeout_s"])
            row.check_command = command
        rows.append(row)
    AuditNode.objects.bulk_create(rows)
    run.phase = Phase.NODES
    run.phase_deadline = timezone.now() + timedelta(seconds=options["node_timeout_s"] + GRACE_S)
    run.plan = {"phases": ["nodes"] + (["load"] if options["load"] else []) + (["collective"] if options["collective"]
                                                                                else []), "node_args": args,
                "nodes": [n.name for n in nodes]}
    run.save(update_fields=["phase", "phase_deadline", "plan", "updated"])


def _settled(rows: list[AuditNode], attr: str, deadline_passed: bool) -> bool:
    """Whether every row's command of this phase has ended (or the phase's deadline has passed)."""
    return deadline_passed or not any(getattr(r, attr) is not None and getattr(r, attr).state in OPEN_STATES
                                      for r in rows)


def _node_outcomes(run: AuditRun, rows: list[AuditNode], deadline_passed: bool) -> int:
    """Settle the rows whose node check has ended (all of them past the deadline); how many changed."""
    timeout = run.options["node_timeout_s"]
    changed = 0
    for row in rows:
        if row.outcome != NodeOutcome.PENDING:
            continue
        command = row.check_command
        if command.state == CommandState.SUCCEEDED and isinstance(command.result, dict):
            row.report = command.result
            row.outcome = node_status(command.result)
            row.reason = _summary(command.result)
        elif command.state in OPEN_STATES:
            if not deadline_passed:
                continue
            row.outcome, row.reason = NodeOutcome.FAILED, f"no answer to the node checks within {timeout} s"
        else:
            row.outcome = NodeOutcome.FAILED
            row.reason = f"the node checks {command.state}: {command.error or 'no result'}"[:500]
        row.save(update_fields=["outcome", "reason", "report", "updated"])
        changed += 1
    return changed


def _summary(report: dict) -> str:
    failures = report.get("failures") or []
    if not failures:
        return "every check passed"
    first = failures[0]
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"{first.get('code', '')}: {first.get('message', '')}{more}"[:500]


def _reports(rows: list[AuditNode]) -> dict:
    out = {}
    for row in rows:
        name = row.node.name
        if row.outcome == NodeOutcome.NOT_AUDITED:
            out[name] = Missing("not_audited", row.reason)
        elif row.report is None:
            out[name] = Missing("no_answer", row.reason)
        else:
            out[name] = row.report
    return out


# --- the load phase -----------------------------------------------------------------------------

def _skip_reason(run: AuditRun, rows: list[AuditNode], topology, phase: str) -> str | None:
    """Why the fabric phase (`load` or `collective`) does not run, or None."""
    if not run.options[phase]:
        return f"not asked for (options.{phase} is false)"
    if topology is None or not topology.links:
        return "the cluster has no topology: import one to test its links"
    hosts = {h.name for h in topology.hosts}
    answered = {r.node.name for r in rows if r.report is not None}
    missing = sorted(hosts - answered)
    if missing:
        return (f"{len(missing)} hosts of the topology are not audited or did not answer "
                f"({', '.join(missing[:5])}{'...' if len(missing) > 5 else ''}): the fabric is tested only whole")
    return None


def _topology(cluster: Cluster):
    from workers.fabric.topology import parse_topology

    if not cluster.topology_imported_at:
        return None
    return parse_topology(export_topology(cluster))


def _nic_addresses(cluster: Cluster) -> dict[str, str]:
    """The topology NICs' first addresses (no prefix length)."""
    return {name: addrs[0].split("/", 1)[0] for name, addrs in
            Nic.objects.filter(cluster=cluster, in_topology=True).values_list("name", "addresses") if addrs}


def _worst_delivery_s(rows: list[AuditNode]) -> float | None:
    """The longest a node-phase command took from issue to its agent's claim."""
    waits = [(r.check_command.delivered_at - r.check_command.created).total_seconds() for r in rows
             if r.check_command is not None and r.check_command.delivered_at is not None]
    return max(waits, default=None)


def _start_load_phase(run: AuditRun, rows: list[AuditNode], topology) -> None:
    from workers.trafficplan.assign import agent_args
    from workers.trafficplan.plan import PlanError, plan_traffic
    from workers.trafficplan.timing import load_timing

    options = run.options
    addresses = _nic_addresses(run.cluster)
    devices = dict(Nic.objects.filter(cluster=run.cluster, in_topology=True).exclude(device="")
                   .values_list("name", "device"))
    timing = load_timing(len(topology.hosts), _worst_delivery_s(rows), lead_min_s=options["load_lead_s"],
                         measure_s=options["load_duration_s"])
    # The common start, in cluster time: each agent starts by its synchronized clock. The console's
    # own clock stands in for the cluster's here: NTP keeps it within milliseconds, the lead is seconds.
    start_at = time.time() + timing.lead_s
    try:
        plan = plan_traffic(topology, flows_per_nic=options["flows_per_nic"], ports_per_pair=2)
        by_host = agent_args(plan, topology, addresses, run=run.pk % 2**32, start_at=start_at,
                             duration_s=timing.duration_s, rate_mbit=options["rate_mbit"],
                             packet_bytes=options["packet_bytes"], devices=devices, trace_ttl=ecmp.TRACE_TTL,
                             trace_extra=ecmp.TRACE_EXTRA)
    except PlanError as exc:
        run.plan = run.plan | {"load": {"skipped": f"no traffic plan: {exc}"}}
        run.save(update_fields=["plan", "updated"])
        _after_load(run, rows, topology, None)
        return
    timeout = int(timing.lead_s + timing.duration_s) + 60
    for row in rows:
        host_args = by_host.get(row.node.name)
        if host_args is None:
            continue
        row.load_command, _ = commands.issue_command(row.node, "audit.load", host_args,
                                                     idempotency_key=f"audit-{run.pk}-load", timeout_s=timeout)
        row.save(update_fields=["load_command", "updated"])
    run.phase = Phase.LOAD
    run.phase_deadline = timezone.now() + timedelta(seconds=timeout + GRACE_S)
    run.plan = run.plan | {"load": {"flows": len(plan.flows), "links": len(plan.link_ids),
                                    "flows_per_nic": plan.flows_per_nic, "rate_mbit": options["rate_mbit"],
                                    "measure_s": options["load_duration_s"], "start_at": start_at,
                                    "below_target": len(plan.below_target())} | timing.to_dict()}
    run.save(update_fields=["phase", "phase_deadline", "plan", "updated"])


def _fabric_verdict(run: AuditRun, rows: list[AuditNode], topology) -> dict:
    """The loaded fabric's culprits. Each pair counts from the window both its ends had started in
    (a late start is the console's or the machine's delay, not loss) over at least the measured
    span; a pair whose agent started later than the plan's allowance, or did not answer, is not
    measured (a warning, not a pass). Agents that could not start by a synchronized clock are named."""
    from workers.trafficplan.plan import plan_traffic
    from workers.trafficplan.windows import combine_measured, observations
    from workers.triangulation import triangulate

    plan = plan_traffic(topology, flows_per_nic=run.options["flows_per_nic"], ports_per_pair=2)  # deterministic
    load = run.plan.get("load") or {}
    results = {r.node.name: r.load_command.result for r in rows
               if r.load_command is not None and r.load_command.state == CommandState.SUCCEEDED
               and isinstance(r.load_command.result, dict)}
    silent = sorted(r.node.name for r in rows if r.load_command is not None and r.node.name not in results)
    merged = observations(plan, results)
    window_s = float(next(iter(results.values()))["window_s"]) if results else 1.0
    late = {host: float(res.get("started_late_s", 0)) for host, res in results.items()}
    first_window = {n.name: math.ceil(late[n.host] / window_s - 1e-9) for n in topology.nics if n.host in late}
    min_windows = int(load.get("min_windows") or math.ceil(run.options["load_duration_s"] / window_s))
    window, unmeasured = combine_measured(merged["windows"], first_window, min_windows)
    unsynced = sorted(h for h, res in results.items() if (res.get("clock") or {}).get("basis") != "lockstep")
    traces = [t for res in results.values() for t in res.get("paths") or []]
    spread = ecmp.check(topology, [{"id": f.id, "src": f.src, "dst": f.dst} for f in plan.flows], traces,
                        _nic_addresses(run.cluster))
    base = {"pairs": window["probes"] if window else [], "missing": merged["missing"] + unmeasured, "silent": silent,
            "started_late_s": {h: round(v, 3) for h, v in sorted(late.items()) if v >= window_s},
            "late_allowance_s": load.get("late_allowance_s"), "unsynced": unsynced, "ecmp": spread}
    if window is None:
        return base | {"culprits": []}
    return triangulate(topology, window).to_document() | base


# --- the collective phase ------------------------------------------------------------------------

def _hardware_of(rows: list[AuditNode]) -> str | None:
    """The threshold profile most of the nodes' checks used."""
    counts = Counter((r.report or {}).get("hardware") for r in rows if r.report)
    counts.pop(None, None)
    return counts.most_common(1)[0][0] if counts else None


def _collective_args(run: AuditRun, rows: list[AuditNode], group: dict, member: dict) -> dict:
    options = run.options
    args = {"init": group["init"], "world_size": len(group["members"]), "rank_offset": member["rank"],
            "local_ranks": 1, "backend": options["collective_backend"], "op": "all_reduce",
            "sizes": [options["collective_size_bytes"]], "iters": options["collective_iters"], "warmup": 1,
            "timeout_s": float(options["collective_timeout_s"])}
    if len(member["ifnames"]) == 1:
        args["ifname"] = member["ifnames"][0]
    else:  # gloo spreads a group over the listed interfaces
        args["env"] = {"GLOO_SOCKET_IFNAME": ",".join(member["ifnames"]),
                       "NCCL_SOCKET_IFNAME": ",".join(member["ifnames"])}
    if options.get("collective_min_busbw_gbs") is not None:
        args["min_busbw_gbs"] = options["collective_min_busbw_gbs"]
    elif options["collective_backend"] == "nccl":
        hardware = options.get("hardware") or _hardware_of(rows)
        if hardware in HARDWARE:
            args |= {"hardware": hardware, "threshold": "per_nic_busbw_gbs"}
    return args


def _start_collective_step(run: AuditRun, rows: list[AuditNode], step: str) -> bool:
    """Issue the commands of the groups of `step`; False when it has none."""
    plan = run.plan["collective"]
    by_name = {r.node.name: r for r in rows}
    timeout = run.options["collective_timeout_s"] + 30
    started = False
    for i, group in enumerate(plan["groups"]):
        if group["step"] != step:
            continue
        group["commands"] = {}
        for member in group["members"]:
            row = by_name[member["host"]]
            command, _ = commands.issue_command(row.node, "audit.collective",
                                                _collective_args(run, rows, group, member),
                                                idempotency_key=f"audit-{run.pk}-collective-{i}", timeout_s=timeout)
            group["commands"][member["host"]] = str(command.pk)
        started = True
    if started:
        plan["step"] = step
        run.phase = Phase.COLLECTIVE
        run.phase_deadline = timezone.now() + timedelta(seconds=timeout + GRACE_S)
        run.save(update_fields=["plan", "phase", "phase_deadline", "updated"])
    return started


def _collective_commands(run: AuditRun, step: str | None = None) -> dict[int, Command]:
    ids = [cid for g in (run.plan.get("collective") or {}).get("groups", []) if step is None or g["step"] == step
           for cid in (g.get("commands") or {}).values()]
    return {str(c.pk): c for c in Command.objects.filter(pk__in=ids)}


def _collective_findings(run: AuditRun) -> list[dict]:
    from workers.audit.collective import findings

    issued = _collective_commands(run)
    results = []
    for group in run.plan["collective"]["groups"]:
        if "commands" not in group:
            continue
        answers = {}
        for host, cid in group["commands"].items():
            c = issued.get(cid)
            answers[host] = c.result if c is not None and c.state == CommandState.SUCCEEDED and isinstance(
                c.result, dict) else None
        results.append({"name": group["name"], "world_size": len(group["members"]), "answers": answers})
    return findings(results)


def _after_load(run: AuditRun, rows: list[AuditNode], topology, fabric: dict | None) -> None:
    """Start the collective phase when asked for (and every host answered), else finish."""
    from workers.audit.collective import groups

    skip = _skip_reason(run, rows, topology, "collective")
    if skip is None:
        devices = dict(Nic.objects.filter(cluster=run.cluster, in_topology=True).exclude(device="")
                       .values_list("name", "device"))
        planned = groups(topology, [h.name for h in topology.hosts], _nic_addresses(run.cluster), devices,
                         run=run.pk)
        if not planned:
            skip = "no rail has an addressed NIC on every host"
        else:
            run.plan = run.plan | {"collective": {"groups": planned}}
            run.report = (run.report or {}) | {"fabric": fabric}
            run.save(update_fields=["plan", "report", "updated"])
            first = "rails" if any(g["step"] == "rails" for g in planned) else "cluster"
            _start_collective_step(run, rows, first)
            return
    if run.options["collective"]:
        run.plan = run.plan | {"collective": {"skipped": skip}}
        run.save(update_fields=["plan", "updated"])
    _finish(run, rows, fabric=fabric)


# --- advancing ----------------------------------------------------------------------------------

def advance(run: AuditRun) -> AuditRun:
    """One step of a running audit (see the module docstring); a no-op once it has ended."""
    with transaction.atomic():
        run = AuditRun.objects.select_for_update().select_related("cluster").filter(pk=run.pk).first()
        if run is None or run.state != RunState.RUNNING:
            return run
        rows = list(AuditNode.objects.filter(run=run).select_related("node", "check_command", "load_command"))
        passed = run.phase_deadline is not None and timezone.now() >= run.phase_deadline
        if run.phase == Phase.NODES:
            if _node_outcomes(run, rows, passed):
                _publish(run)  # live progress: a node's outcome is in
            if any(r.outcome == NodeOutcome.PENDING for r in rows):
                return run
            if passed:
                _cancel_open_commands(run)  # a late answer would not count any more
            reports = _reports(rows)
            agreement = fleet_agreement.agreement(fleet_facts(reports)) if fleet_facts(reports) else None
            run.report = {"fleet": agreement}
            run.save(update_fields=["report", "updated"])
            topology = _topology(run.cluster)
            skip = _skip_reason(run, rows, topology, "load")
            if skip:
                run.plan = run.plan | {"load": {"skipped": skip}}
                run.save(update_fields=["plan", "updated"])
                _after_load(run, rows, topology, None)
            else:
                _start_load_phase(run, rows, topology)
            _publish(run)
        elif run.phase == Phase.LOAD:
            if not _settled(rows, "load_command", passed):
                return run
            if passed:
                _cancel_open_commands(run)
            topology = _topology(run.cluster)
            _after_load(run, rows, topology, _fabric_verdict(run, rows, topology))
            _publish(run)
        elif run.phase == Phase.COLLECTIVE:
            step = run.plan["collective"]["step"]
            if not passed and any(c.state in OPEN_STATES for c in _collective_commands(run, step).values()):
                return run
            if passed:
                _cancel_open_commands(run)
            if step == "rails" and _start_collective_step(run, rows, "cluster"):
                _publish(run)
                return run
            _finish(run, rows, fabric=(run.report or {}).get("fabric"))
            _publish(run)
    return run


def _finish(run: AuditRun, rows: list[AuditNode], fabric: dict | None = None) -> None:
    reports = _reports(rows)
    fleet_doc = (run.report or {}).get("fleet")
    collective = _collective_findings(run) if "groups" in (run.plan.get("collective") or {}) else None
    doc = compose(reports, fleet=fleet_doc, fabric=fabric, collective=collective)
    AuditFinding.objects.bulk_create([
        AuditFinding(organization_id=run.organization_id, cluster_id=run.cluster_id, run=run, phase=f["phase"],
                     element_kind=f["element"]["kind"], element=str(f["element"]["name"])[:255],
                     check_name=f["check"][:64], status=f["status"], culprit=f["culprit"], code=f["code"][:64],
                     severity=f["severity"][:16], message=f["message"], action=f.get("action", ""),
                     evidence=f["evidence"], threshold=f["threshold"])
        for f in doc["findings"]
    ])
    culprit_hosts = {c["name"] for c in doc["culprits"] if c["kind"] == "host"} | {
        c["name"].split("/", 1)[0] for c in doc["culprits"] if c["kind"] == "nic"}
    for row in rows:  # a node named by the fleet agreement or the fabric fails too
        if row.outcome in (NodeOutcome.PASSED, NodeOutcome.WARN) and row.node.name in culprit_hosts:
            row.outcome = NodeOutcome.FAILED
            row.reason = next(f["message"] for f in doc["findings"] if f["culprit"] and
                              str(f["element"]["name"]).split("/", 1)[0] == row.node.name)[:500]
            row.save(update_fields=["outcome", "reason", "updated"])
    run.report = {"fleet": fleet_doc, "fabric": fabric, "collective": collective, **doc}
    run.verdict = {"pass": Verdict.PASS, "warn": Verdict.WARN}.get(doc["status"], Verdict.FAIL)
    run.state, run.phase, run.phase_deadline, run.finished_at = RunState.FINISHED, Phase.DONE, None, timezone.now()
    run.save(update_fields=["report", "verdict", "state", "phase", "phase_deadline", "finished_at", "updated"])
    if run.trigger == Trigger.MAINTENANCE:
        for row in rows:
            if row.outcome in (NodeOutcome.PASSED, NodeOutcome.WARN) and row.node.state == NodeState.DRAINING:
                fleet.undrain(row.node)


def open_runs():
    return AuditRun.objects.filter(state=RunState.RUNNING)


# --- maintenance gating, schedules ---------------------------------------------------------------

def return_to_service(node: Node, *, user=None, options=None) -> AuditRun:
    """Audit a draining node before it returns to `ready`: it returns only when it passes, and
    stays draining when it fails."""
    if node.state != NodeState.DRAINING:
        raise Conflict(f"Only a draining node returns to service through an audit (this one is {node.state}).",
                       field="state")
    run, _ = start_audit(node.cluster, node_ids=[node.pk], options=options, user=user, trigger=Trigger.MAINTENANCE)
    return run


def set_schedule(cluster: Cluster, *, interval_s, enabled: bool = True, options=None) -> AuditSchedule:
    """Audit the cluster every `interval_s` seconds (the first one an interval from now)."""
    if not isinstance(interval_s, int) or isinstance(interval_s, bool) or interval_s < MIN_SCHEDULE_INTERVAL_S:
        raise Invalid(f"interval_s must be an integer of at least {MIN_SCHEDULE_INTERVAL_S}.", field="interval_s")
    if not isinstance(enabled, bool):
        raise Invalid("enabled must be true or false.", field="enabled")
    options = clean_options(options)
    schedule, _ = AuditSchedule.objects.update_or_create(
        cluster=cluster, defaults={"organization_id": cluster.organization_id, "interval_s": interval_s,
                                   "enabled": enabled, "options": options,
                                   "next_at": timezone.now() + timedelta(seconds=interval_s)})
    return schedule


def start_due(schedule: AuditSchedule, now=None) -> AuditRun | None:
    """Start the schedule's audit when it is due (a running audit of its nodes postpones it)."""
    now = now or timezone.now()
    if not schedule.enabled or schedule.next_at > now:
        return None
    try:
        run, _ = start_audit(schedule.cluster, options=schedule.options, trigger=Trigger.SCHEDULED,
                             idempotency_key=f"schedule-{schedule.pk}-{int(schedule.next_at.timestamp())}")
    except (Conflict, Invalid):
        run = None
    schedule.last_run = run or schedule.last_run
    schedule.next_at = now + timedelta(seconds=schedule.interval_s)
    schedule.save(update_fields=["last_run", "next_at", "updated"])
    return run


def _kick(run: AuditRun) -> None:
    from console.audits.tasks import advance_audit

    advance_audit.delay(run.organization_id, run.pk)


def _publish(run: AuditRun) -> None:
    counts = Counter(AuditNode.objects.filter(run=run).values_list("outcome", flat=True))
    publish(run.organization_id, run.cluster_id, "audit",
            {"id": run.pk, "state": run.state, "phase": run.phase, "verdict": run.verdict,
             "nodes": {k: counts.get(k, 0) for k in NodeOutcome.values}}, key=str(run.pk))
