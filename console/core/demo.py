"""The demo's console side: an organization, its owner, a cluster with a topology, and an
enrollment token for the demo's agents. Idempotent: running it again reuses what exists."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from console.core import scoping
from console.fleet import services as fleet
from console.fleet.models import Cluster, Node
from console.tenancy import services as tenancy
from console.tenancy.models import Membership, Organization, Role

USERNAME = "demo"
PASSWORD = "lockstep-demo"  # noqa: S105  (a local demo on embedded defaults only; printed by `make demo`)
ORGANIZATION = "Demo GPU Cloud"


@dataclass(frozen=True)
class DemoSeed:
    organization: Organization
    cluster: Cluster
    enrollment_token: str


def seed_demo(topology: dict) -> DemoSeed:
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.filter(username=USERNAME).first()
        if user is None:
            user = User.objects.create_user(USERNAME, email="demo@lockstep.local", password=PASSWORD)
        with scoping.unscoped("the demo finds its organization by slug"):
            organization = Organization.objects.filter(slug="demo").first()
        if organization is None:
            organization = tenancy.create_organization(ORGANIZATION, user, slug="demo")
        with scoping.for_organization(organization.pk):
            Membership.objects.get_or_create(organization=organization, user=user, defaults={"role": Role.OWNER})
            cluster = Cluster.objects.filter(organization=organization, name="demo-cluster").first() or \
                fleet.create_cluster(organization.pk, "demo-cluster",
                                     "An emulated rail-optimized fabric with real agents.")
            fleet.import_topology(cluster, topology)
            # The demo's agents start with fresh state and enroll again each time the demo starts: as
            # an operator would, the demo resets its nodes first (a token alone never replaces an
            # active credential), and asks for a token of unlimited uses.
            for node in Node.objects.filter(cluster=cluster):
                fleet.reset_credentials(node)
            minted = fleet.mint_enrollment_token(cluster, description="demo agents", max_uses=None)
    return DemoSeed(organization, cluster, minted.plaintext)
