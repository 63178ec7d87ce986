"""The demo's console side: an organization, its owner, a cluster with a topology, and an
enrollment token for the demo's agents. Idempotent: running it again reuses what exists."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from console.fleet.models import Cluster, EnrollmentToken
from console.fleet.topology_io import import_topology
from console.tenancy.models import Membership, Organization, Role

USERNAME = "demo"
PASSWORD = "lockstep-demo"  # noqa: S105  (a local demo on embedded defaults only; printed by `make demo`)


@dataclass(frozen=True)
class DemoSeed:
    organization: Organization
    cluster: Cluster
    enrollment_token: str


def seed_demo(topology: dict) -> DemoSeed:
    with transaction.atomic():
        organization, _ = Organization.objects.get_or_create(slug="demo", defaults={"name": "Demo GPU Cloud"})
        User = get_user_model()
        user = User.objects.filter(username=USERNAME).first()
        if user is None:
            user = User.objects.create_user(USERNAME, email="demo@lockstep.local", password=PASSWORD)
        Membership.objects.get_or_create(organization=organization, user=user, defaults={"role": Role.OWNER})
        cluster, _ = Cluster.objects.get_or_create(
            organization=organization, name="demo-cluster",
            defaults={"description": "An emulated rail-optimized fabric with real agents."},
        )
        import_topology(cluster, topology)
        token = EnrollmentToken(organization=organization, cluster=cluster, description="demo agents",
                                expires=timezone.now() + timedelta(days=1))
        plaintext = token.set_new_secret()
        token.save()
    return DemoSeed(organization, cluster, plaintext)
