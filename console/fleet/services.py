"""The fleet's one writer: clusters, enrollment tokens, enrollment, node states, node counts.

API views, browser pages, the demo, management commands and Celery tasks all call these; none
of them mints a secret, moves a node between states or counts nodes by state on its own. The
two larger writers live beside this module and are part of it: `topology_io` (a cluster's
declared fabric) and `inventory` (what an agent reports), re-exported here.

Every function runs in the caller's tenant scope (`console.core.scoping`) and raises domain
errors (`console.core.errors`), never HTTP ones. Node states:

    enrolling ──first contact──▶ ready ──silent > NODE_LOST_AFTER_S──▶ lost ──contact──▶ ready
    ready/lost ──drain──▶ draining ──undrain──▶ ready;   any ──retire──▶ retired (credentials revoked)

Every transition is a conditional UPDATE on the expected old state, so concurrent callers (two
sweeps, a sweep and a heartbeat) each move a node at most once, and it publishes a live event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from console.core import scoping
from console.core.errors import Conflict, Forbidden, Invalid, Unauthenticated
from console.core.limits import check_columns
from console.fleet.events import cluster_changed, node_changed
from console.fleet.inventory import InventoryError, apply_inventory, validate_inventory
from console.fleet.models import Cluster, EnrollmentToken, Node, NodeCredential, NodeState
from console.fleet.topology_io import ImportSummary, export_topology
from console.fleet.topology_io import import_topology as _import_topology
from workers.fabric.topology import TopologyError

__all__ = [
    "CONTACT_REVIVES",
    "ENROLLMENT_TOKEN_MAX_TTL",
    "ENROLLMENT_TOKEN_MAX_USES",
    "ENROLLMENT_TOKEN_TTL",
    "Enrollment",
    "InventoryError",
    "MintedEnrollmentToken",
    "apply_inventory",
    "create_cluster",
    "delete_cluster",
    "drain",
    "enroll",
    "export_topology",
    "import_topology",
    "mark_seen",
    "record_heartbeat",
    "mint_enrollment_token",
    "node_counts_by_state",
    "reset_credentials",
    "retire",
    "revoke_enrollment_token",
    "store_health_report",
    "sweep_lost",
    "undrain",
    "update_cluster",
    "validate_inventory",
]

# --- enrollment tokens ------------------------------------------------------------------------

# One default for the page, the API and the CLI (`manage.py create_enrollment_token`): a token that
# leaks is good for a few enrollments within the hour; a larger batch of nodes asks for more.
ENROLLMENT_TOKEN_TTL = timedelta(hours=1)
ENROLLMENT_TOKEN_MAX_USES: int | None = 10  # None (asked for explicitly): unlimited
ENROLLMENT_TOKEN_MAX_TTL = timedelta(days=365)
ENROLLMENT_TOKEN_MIN_TTL = timedelta(minutes=1)


@dataclass(frozen=True)
class MintedEnrollmentToken:
    token: EnrollmentToken
    plaintext: str  # shown once, never stored


def mint_enrollment_token(cluster: Cluster, *, created_by=None, description: str = "",
                          expires: datetime | None = None, lifetime: timedelta | None = None,
                          max_uses: int | None = ENROLLMENT_TOKEN_MAX_USES) -> MintedEnrollmentToken:
    """A new enrollment token for the cluster: `expires`, or `lifetime` from now (default
    ENROLLMENT_TOKEN_TTL), and at most `max_uses` enrollments."""
    now = timezone.now()
    if expires is not None and lifetime is not None:
        raise Invalid("Give either an expiry time or a lifetime, not both.", field="expires_in_s")
    if expires is None:
        lifetime = ENROLLMENT_TOKEN_TTL if lifetime is None else lifetime
        if not ENROLLMENT_TOKEN_MIN_TTL <= lifetime <= ENROLLMENT_TOKEN_MAX_TTL:
            raise Invalid(f"The lifetime must be between {ENROLLMENT_TOKEN_MIN_TTL} and "
                          f"{ENROLLMENT_TOKEN_MAX_TTL.days} days.", field="expires_in_s")
        expires = now + lifetime
    elif expires <= now:
        raise Invalid("The expiry must be in the future.", field="expires")
    elif expires - now > ENROLLMENT_TOKEN_MAX_TTL:
        raise Invalid(f"The expiry must be within {ENROLLMENT_TOKEN_MAX_TTL.days} days.", field="expires")
    if max_uses is not None and max_uses < 1:
        raise Invalid("Maximum uses must be at least 1 (or empty for unlimited).", field="max_uses")
    if len(description) > 200:
        raise Invalid("The description is longer than 200 characters.", field="description")
    token = EnrollmentToken(organization_id=cluster.organization_id, cluster=cluster, description=description,
                            created_by=created_by if getattr(created_by, "is_authenticated", False) else None,
                            expires=expires, max_uses=max_uses)
    plaintext = token.set_new_secret()
    token.save()
    return MintedEnrollmentToken(token, plaintext)


def revoke_enrollment_token(token: EnrollmentToken) -> bool:
    """Revoke it; False when it was revoked already."""
    if token.is_revoked:
        return False
    token.revoke()
    return True


# --- clusters -----------------------------------------------------------------------------------

def _cluster_name(name) -> str:
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
        raise Invalid("A cluster needs a name of 1 to 100 characters.", field="name")
    return name.strip()


def create_cluster(organization_id: int, name: str, description: str = "") -> Cluster:
    name = _cluster_name(name)
    try:
        with transaction.atomic():
            if Cluster.objects.filter(organization_id=organization_id, name=name).exists():
                raise IntegrityError
            cluster = Cluster.objects.create(organization_id=organization_id, name=name, description=description)
            cluster_changed(organization_id, cluster.pk)
    except IntegrityError:
        raise Conflict(f"A cluster named {name!r} already exists.", field="name") from None
    return cluster


def update_cluster(cluster: Cluster, *, name: str | None = None, description: str | None = None) -> Cluster:
    fields = ["updated"]
    if name is not None:
        cluster.name = _cluster_name(name)
        fields.append("name")
    if description is not None:
        cluster.description = description
        fields.append("description")
    try:
        with transaction.atomic():
            if name is not None and Cluster.objects.filter(organization_id=cluster.organization_id,
                                                           name=cluster.name).exclude(pk=cluster.pk).exists():
                raise IntegrityError
            cluster.save(update_fields=fields)
            cluster_changed(cluster.organization_id, cluster.pk)
    except IntegrityError:
        raise Conflict(f"A cluster named {cluster.name!r} already exists.", field="name") from None
    return cluster


def delete_cluster(cluster: Cluster) -> None:
    organization_id, pk = cluster.organization_id, cluster.pk
    with transaction.atomic():
        cluster.delete()
        cluster_changed(organization_id, pk, deleted=True)


def import_topology(cluster: Cluster, document) -> ImportSummary:
    """Replace the cluster's declared fabric; a document with any problem changes nothing and is
    refused with every problem named (`Invalid.fields`: `links[12].b` → what is wrong)."""
    try:
        return _import_topology(cluster, document)
    except TopologyError as exc:
        fields: dict[str, str] = {}
        for error in exc.errors:
            path, sep, problem = error.partition(": ")
            key, text = (path, problem) if sep and " " not in path else ("topology", error)
            fields[key] = f"{fields[key]}; {text}" if key in fields else text
        raise Invalid(f"The topology was not imported; nothing changed. {len(exc.errors)} problem(s): "
                      + "; ".join(exc.errors), fields=fields) from None


# --- node counts --------------------------------------------------------------------------------

def node_counts_by_state(cluster_ids) -> dict[int, dict[str, int]]:
    """{cluster id: {state: count for every state, "total": count}} in one query."""
    counts = {pk: dict.fromkeys([*NodeState.values, "total"], 0) for pk in cluster_ids}
    rows = Node.objects.filter(cluster_id__in=list(counts)).values("cluster_id", "state").annotate(n=Count("id"))
    for row in rows.order_by():
        per_cluster = counts[row["cluster_id"]]
        per_cluster[row["state"]] = row["n"]
        per_cluster["total"] += row["n"]
    return counts


# --- node states --------------------------------------------------------------------------------

# A node heard from this recently is not written again (agents talk every few seconds).
SEEN_RESOLUTION = timedelta(seconds=5)
CONTACT_REVIVES = (NodeState.ENROLLING, NodeState.LOST)


def mark_seen(node: Node, now=None) -> Node:
    """Record contact from a node's agent; an enrolling or lost node becomes ready."""
    now = now or timezone.now()
    if node.state in CONTACT_REVIVES and _transition(node, CONTACT_REVIVES, NodeState.READY, now, last_seen=now):
        return node
    if node.last_seen is None or now - node.last_seen >= SEEN_RESOLUTION:
        Node.objects.filter(pk=node.pk).update(last_seen=now)
        node.last_seen = now
    return node


def record_heartbeat(node: Node, status: dict, agent_version: str | None) -> datetime:
    """Store an agent's heartbeat (its status counters, its version) and mark the node seen, in
    one UPDATE. Returns the time it was recorded."""
    now = timezone.now()
    fields = {"agent_status": status, "last_seen": now}
    if agent_version is not None and agent_version != node.agent_version:
        check_columns([("agent_version", Node, "agent_version", agent_version)])
        fields["agent_version"] = agent_version
    Node.objects.filter(pk=node.pk).update(**fields)
    return now


def store_health_report(node_id: int, report: dict, at: datetime) -> bool:
    """The node's health report becomes `report` (taken at `at`) unless a newer one is stored.
    Both the `node.health` command's result and `node.health` telemetry land here."""
    updated = Node.objects.filter(Q(health_report_at__isnull=True) | Q(health_report_at__lt=at), pk=node_id).update(
        health_report=report, health_report_at=at, updated=timezone.now()
    )
    return bool(updated)


def sweep_lost(now=None) -> int:
    """Mark ready nodes that have been silent too long as lost (in the caller's scope: the
    periodic task runs it unscoped). Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.LOCKSTEP["NODE_LOST_AFTER_S"])
    moved = 0
    for node in Node.objects.filter(state=NodeState.READY, last_seen__lt=cutoff).only(
        "id", "organization_id", "cluster_id", "name", "state", "last_seen"
    ):
        moved += _transition(node, (NodeState.READY,), NodeState.LOST, now, extra_filter={"last_seen__lt": cutoff})
    return moved


def drain(node: Node) -> None:
    if not _transition(node, (NodeState.READY, NodeState.LOST, NodeState.ENROLLING), NodeState.DRAINING):
        raise Conflict(f"A {node.state} node cannot be drained.", field="state")


def undrain(node: Node) -> None:
    if not _transition(node, (NodeState.DRAINING,), NodeState.READY):
        raise Conflict(f"Only a draining node can be returned to service (this one is {node.state}).",
                       field="state")


def retire(node: Node) -> None:
    with transaction.atomic():
        if not _transition(node, tuple(s for s in NodeState if s != NodeState.RETIRED), NodeState.RETIRED):
            raise Conflict("The node is already retired.", field="state")
        NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=timezone.now())


def _transition(node: Node, from_states, to_state, now=None, extra_filter=None, **fields) -> bool:
    now = now or timezone.now()
    updated = Node.objects.filter(pk=node.pk, state__in=list(from_states), **(extra_filter or {})).update(
        state=to_state, state_changed=now, updated=now, **fields
    )
    if not updated:
        # Report the state the node is really in, not the caller's stale copy.
        node.state = Node.objects.filter(pk=node.pk).values_list("state", flat=True).first() or node.state
        return False
    node.state, node.state_changed = to_state, now
    for key, value in fields.items():
        setattr(node, key, value)
    node_changed(node)
    return True


# --- enrollment ---------------------------------------------------------------------------------

FACT_LIMITS = {"hostname": 255, "machine_id": 64}
OPTIONAL_FACTS = ("boot_id", "kernel", "os", "arch", "cpu_model", "cpu_count", "memory_bytes", "agent_version")


@dataclass(frozen=True)
class Enrollment:
    node: Node
    credential: str  # the node's new secret, shown once


def _clean_host(host) -> dict:
    if not isinstance(host, dict):
        raise Invalid("host must be an object of host facts.", field="host")
    facts = {}
    for key, limit in FACT_LIMITS.items():
        value = host.get(key)
        if not isinstance(value, str) or not value.strip() or len(value) > limit or any(c.isspace() for c in value):
            raise Invalid(f"host.{key} is required: a string of 1..{limit} characters without spaces.",
                          field=f"host.{key}")
        facts[key] = value.strip()
    # The hostname becomes the node's name, the shorter column.
    check_columns([("host.hostname", Node, "name", facts["hostname"])])
    for key in OPTIONAL_FACTS:
        if key in host and isinstance(host[key], (str, int, float)) and not isinstance(host[key], bool):
            facts[key] = host[key] if not isinstance(host[key], str) else host[key][:255]
    return facts


def _valid_enrollment_token(plaintext) -> EnrollmentToken:
    # The token is the only thing that names an organization here: look it up across all.
    with scoping.unscoped("find the enrollment token an agent presents"):
        token = EnrollmentToken.lookup(plaintext if isinstance(plaintext, str) else "",
                                       queryset=EnrollmentToken.objects.select_for_update())
    if token is None:
        raise Unauthenticated("The enrollment token is not valid. Create a new one in the console "
                              "(cluster page, Enroll nodes).", code="enrollment_token_invalid")
    if token.is_revoked:
        raise Unauthenticated("This enrollment token was revoked. Ask an operator for a new one.",
                              code="enrollment_token_revoked")
    if token.is_expired:
        raise Unauthenticated("This enrollment token has expired. Create a new one in the console.",
                              code="enrollment_token_expired")
    if token.is_exhausted:
        raise Unauthenticated(f"This enrollment token was already used {token.uses} time(s), its maximum. "
                              "Create a new one.", code="enrollment_token_exhausted")
    return token


def enroll(token_plaintext, host, cluster_id=None, current_credential: str = "") -> Enrollment:
    """Exchange an enrollment token and host facts for a node and its credential (the node's
    previous credentials are revoked). Runs in the token's organization.

    A node that holds an active credential is not taken over by a token alone (its machine id is
    no secret): the agent proves the re-enrollment with `current_credential`, the one it holds, or
    an operator resets the node first (`reset_credentials`, or retires it)."""
    facts = _clean_host(host)
    if cluster_id is not None and (not isinstance(cluster_id, int) or isinstance(cluster_id, bool)):
        raise Invalid("cluster_id must be an integer.", field="cluster_id")
    with transaction.atomic():
        token = _valid_enrollment_token(token_plaintext)
        if cluster_id is not None and cluster_id != token.cluster_id:
            raise Forbidden("This enrollment token belongs to another cluster. Use a token created on the cluster "
                            "you are enrolling into.", code="enrollment_token_wrong_cluster")
        with scoping.for_organization(token.organization_id):
            node = _match_node(token, facts)
            if node is not None:
                _require_proof(node, current_credential)
            now = timezone.now()
            if node is None:
                node = Node(organization_id=token.organization_id, cluster_id=token.cluster_id, name=facts["hostname"])
            if node.state == NodeState.RETIRED or node.pk is None:
                node.state, node.state_changed = NodeState.ENROLLING, now
            node.hostname, node.machine_id = facts["hostname"], facts["machine_id"]
            node.facts = {**node.facts, **facts}
            node.agent_version = str(facts.get("agent_version", ""))[:50]
            node.enrolled_at = now
            node.save()
            NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
            credential = NodeCredential(organization_id=node.organization_id, cluster_id=node.cluster_id, node=node)
            plaintext = credential.set_new_secret()
            credential.save()
            EnrollmentToken.objects.filter(pk=token.pk).update(uses=F("uses") + 1, last_used=now)
            node_changed(node)
    return Enrollment(node, plaintext)


def _require_proof(node: Node, current_credential: str) -> None:
    active = [c for c in NodeCredential.objects.filter(node=node, revoked_at__isnull=True) if not c.is_expired]
    if not active or node.state == NodeState.RETIRED:
        return
    proof = NodeCredential.lookup(current_credential) if current_credential else None
    if proof is None or proof.pk not in {c.pk for c in active}:
        raise Conflict(
            f"Node {node.name!r} is enrolled and its agent holds an active credential; an enrollment token "
            "alone does not replace it. Re-enroll from that node's agent (it proves it with its current "
            "credential: the installer's --reenroll), or have an operator reset the node's credential "
            f"(POST /api/v1/nodes/{node.pk}/reset-credential/) and enroll again.",
            code="node_already_enrolled",
        )


def reset_credentials(node: Node) -> int:
    """Revoke the node's credentials (its agent stops at its next request) so that an enrollment
    token may enroll the node again; how many were active."""
    with transaction.atomic():
        revoked = NodeCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=timezone.now())
    node_changed(node)
    return revoked


def _match_node(token: EnrollmentToken, facts: dict) -> Node | None:
    nodes = Node.objects.select_for_update().filter(cluster_id=token.cluster_id)
    by_machine = nodes.filter(machine_id=facts["machine_id"]).first()
    if by_machine is not None:
        if by_machine.name != facts["hostname"] and nodes.filter(name=facts["hostname"]).exclude(
            pk=by_machine.pk
        ).exclude(state=NodeState.RETIRED).exists():
            raise Conflict(f"Another node of this cluster is already named {facts['hostname']!r}. Rename this "
                           "host or retire the other node.", code="hostname_taken")
        return by_machine
    by_name = nodes.filter(name=facts["hostname"]).first()
    if by_name is not None and by_name.machine_id and by_name.state != NodeState.RETIRED:
        raise Conflict(
            f"Node {facts['hostname']!r} is already enrolled by another machine (machine-id "
            f"{by_name.machine_id[:8]}…). If this is a cloned VM, give it its own /etc/machine-id; "
            "if the old machine is gone, retire that node first.",
            code="hostname_taken",
        )
    return by_name
