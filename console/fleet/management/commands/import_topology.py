import json
import sys

from django.core.management.base import BaseCommand, CommandError

from console.core import scoping
from console.core.errors import DomainError
from console.fleet import services
from console.fleet.models import Cluster


class Command(BaseCommand):
    help = "Import a lockstep.topology/v1 file into a cluster (replacing its declared fabric)."

    def add_arguments(self, parser):
        parser.add_argument("cluster", type=int, help="The cluster id.")
        parser.add_argument("file", help="A lockstep.topology/v1 JSON file ('-' for standard input).")

    def handle(self, *args, cluster, file, **options):
        with scoping.unscoped("an operator on the console host names a cluster by id"):
            target = Cluster.objects.filter(pk=cluster).first()
        if target is None:
            raise CommandError(f"no cluster with id {cluster}")
        try:
            if file == "-":
                document = json.load(sys.stdin)
            else:
                with open(file, encoding="utf-8") as fh:
                    document = json.load(fh)
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc}") from None
        except json.JSONDecodeError as exc:
            raise CommandError(f"{file} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        try:
            with scoping.for_organization(target.organization_id):
                summary = services.import_topology(target, document)
        except DomainError as exc:
            problems = [f"{field}: {problem}" if field != "topology" else problem
                        for field, problem in exc.fields.items()]
            raise CommandError("\n".join([f"{file} was not imported; nothing changed:", *problems])) from None
        self.stdout.write(json.dumps(summary.as_dict()))
