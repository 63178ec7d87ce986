"""Exchange an enrollment token and host facts for a node and its credential."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from console.fleet.events import node_changed
from console.fleet.models import EnrollmentToken, Node, NodeCredential, NodeState

FACT_LIMITS = {"hostname": 255, "machine_id": 64}
OPTIONAL_FACTS = ("boot_id", "kernel", "os", "arch", "cpu_model", "cpu_count", "memory_bytes", "agent_version")


@dataclass
class EnrollmentRefused(Exception):
    code: str
    detail: str
    status: int
    field: str | None = None


@dataclass(frozen=True)
class Enrollment:
    node: Node
    credential: str


def _clean_host(host) -> dict:
    if not isinstance(host, dict):
        raise EnrollmentRefused("invalid", "host must be an object of host facts", 400, "host")
    facts = {}
    for key, limit in FACT_LIMITS.items():
        value = host.get(key)
        if not isinstance(value, str) or not value.strip() or len(value) > limit or any(c.isspace() for c in value):
            raise EnrollmentRefused(
                "invalid", f"host.{key} is required: a string of 1..{limit} characters without spaces", 400,
                f"host.{key}",
            )
        facts[key] = value.strip()
    for key in OPTIONAL_FACTS:
        if key in host and isinstance(host[key], (str, int, float)) and not isinstance(host[key], bool):
            facts[key] = host[key] if not isinstance(host[key], str) else host[key][:255]
    return facts


def enroll(token_plaintext, host, cluster_id=None) -> Enrollment:
    facts = _clean_host(host)
    if cluster_id is not None and (not isinstance(cluster_id, int) or isinstance(cluster_id, bool)):
        raise EnrollmentRefused("invalid", "cluster_id must be an integer", 400, "cluster_id")
    with transaction.atomic():
        token = EnrollmentToken.lookup(
            token_plaintext if isinstance(token_plaintext, str) else "",
            queryset=EnrollmentToken.objects.select_for_update(),
        )
        if token is None:
            raise EnrollmentRefused("enrollment_token_invalid", "The enrollment token is not valid. "
                                    "Create a new one in the console (cluster page, Enroll nodes).", 401)
        if token.is_revoked:
            raise EnrollmentRefused("enrollment_token_revoked", "This enrollment token was revoked. "
                                    "Ask an operator for a new one.", 401)
        if token.is_expired:
            raise EnrollmentRefused("enrollment_token_expired", "This enrollment token has expired. "
                                    "Create a new one in the console.", 401)
        if token.is_exhausted:
            raise EnrollmentRefused("enrollment_token_exhausted", f"This enrollment token was already used "
                                    f"{token.uses} time(s), its maximum. Create a new one.", 401)
        if cluster_id is not None and cluster_id != token.cluster_id:
            raise EnrollmentRefused("enrollment_token_wrong_cluster", "This enrollment token belongs to another "
                                    "cluster. Use a token created on the cluster you are enrolling into.", 403)
        node = _match_node(token, facts)
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


def _match_node(token: EnrollmentToken, facts: dict) -> Node | None:
    nodes = Node.objects.select_for_update().filter(cluster_id=token.cluster_id)
    by_machine = nodes.filter(machine_id=facts["machine_id"]).first()
    if by_machine is not None:
        if by_machine.name != facts["hostname"] and nodes.filter(name=facts["hostname"]).exclude(
            pk=by_machine.pk
        ).exclude(state=NodeState.RETIRED).exists():
            raise EnrollmentRefused("hostname_taken", f"Another node of this cluster is already named "
                                    f"{facts['hostname']!r}. Rename this host or retire the other node.", 409)
        return by_machine
    by_name = nodes.filter(name=facts["hostname"]).first()
    if by_name is not None and by_name.machine_id and by_name.state != NodeState.RETIRED:
        raise EnrollmentRefused(
            "hostname_taken",
            f"Node {facts['hostname']!r} is already enrolled by another machine (machine-id "
            f"{by_name.machine_id[:8]}…). If this is a cloned VM, give it its own /etc/machine-id; "
            "if the old machine is gone, retire that node first.",
            409,
        )
    return by_name
