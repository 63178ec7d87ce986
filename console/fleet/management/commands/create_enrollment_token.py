from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from console.core import scoping
from console.core.errors import DomainError
from console.fleet import services
from console.fleet.install_command import TOKEN_FILE
from console.fleet.models import Cluster


class Command(BaseCommand):
    help = ("Create an enrollment token for a cluster, with the page's and the API's defaults "
            f"(at most {services.ENROLLMENT_TOKEN_MAX_USES} uses, expiring in {services.ENROLLMENT_TOKEN_TTL}). "
            "The last line printed is the token (shown once).")

    def add_arguments(self, parser):
        parser.add_argument("cluster", type=int, help="The cluster id.")
        parser.add_argument("--max-uses", type=int, default=services.ENROLLMENT_TOKEN_MAX_USES,
                            help=f"Enrollments it allows (default {services.ENROLLMENT_TOKEN_MAX_USES}).")
        parser.add_argument("--expires-in-hours", type=int, default=None,
                            help=f"Lifetime (default {services.ENROLLMENT_TOKEN_TTL}).")
        parser.add_argument("--description", default="")

    def handle(self, *args, cluster, max_uses, expires_in_hours, description, **options):
        with scoping.unscoped("an operator on the console host names a cluster by id"):
            target = Cluster.objects.filter(pk=cluster).first()
        if target is None:
            raise CommandError(f"no cluster with id {cluster}")
        lifetime = timedelta(hours=expires_in_hours) if expires_in_hours is not None else None
        with scoping.for_organization(target.organization_id):
            try:
                minted = services.mint_enrollment_token(target, description=description, lifetime=lifetime,
                                                        max_uses=max_uses)
            except DomainError as exc:
                raise CommandError(exc.detail) from None
        self.stderr.write(f"Enrollment token {minted.token.prefix_display} for cluster {target.name!r}: "
                          f"{minted.token.max_uses} uses, expires {minted.token.expires:%Y-%m-%d %H:%M} UTC. "
                          f"On a node: put it in {TOKEN_FILE} (0600) and run the installer with "
                          f"--token-file {TOKEN_FILE}, or paste it when the installer asks.")
        self.stdout.write(minted.plaintext)
