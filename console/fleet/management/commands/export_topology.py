import json

from django.core.management.base import BaseCommand, CommandError

from console.fleet.models import Cluster
from console.fleet.topology_io import export_topology


class Command(BaseCommand):
    help = "Print a cluster's declared fabric as a lockstep.topology/v1 document."

    def add_arguments(self, parser):
        parser.add_argument("cluster", type=int, help="The cluster id.")

    def handle(self, *args, cluster, **options):
        target = Cluster.objects.filter(pk=cluster).first()
        if target is None:
            raise CommandError(f"no cluster with id {cluster}")
        self.stdout.write(json.dumps(export_topology(target), indent=1))
