import json

from django.core.management.base import BaseCommand, CommandError

from console.core import scoping
from console.fleet import services
from console.fleet.models import Cluster


class Command(BaseCommand):
    help = "Print a cluster's declared fabric as a lockstep.topology/v1 document."

    def add_arguments(self, parser):
        parser.add_argument("cluster", type=int, help="The cluster id.")

    def handle(self, *args, cluster, **options):
        with scoping.unscoped("an operator on the console host names a cluster by id"):
            target = Cluster.objects.filter(pk=cluster).first()
        if target is None:
            raise CommandError(f"no cluster with id {cluster}")
        with scoping.for_organization(target.organization_id):
            self.stdout.write(json.dumps(services.export_topology(target), indent=1))
