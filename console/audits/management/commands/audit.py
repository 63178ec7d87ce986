import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from console.audits import report, services
from console.audits.models import AuditRun, NodeOutcome, RunState
from console.core import scoping
from console.core.errors import DomainError
from console.fleet.models import Cluster, Node

BAR = 30


class Command(BaseCommand):
    help = ("Audit a cluster from the console host: start one (and follow it with a progress bar), show one, "
            "or write its report as JSON or PDF.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser("start", help="Start an audit of a cluster (or of some of its nodes).")
        start.add_argument("cluster", type=int, help="The cluster id.")
        start.add_argument("--node", action="append", default=None, metavar="NAME",
                           help="Audit only this node (repeat for several).")
        start.add_argument("--options", default="{}", help='Audit options as JSON, e.g. \'{"load": false}\'.')
        start.add_argument("--wait", action="store_true", help="Follow the audit until it ends (progress bar).")
        start.add_argument("--timeout", type=float, default=1800, help="How long --wait waits (s).")
        show = sub.add_parser("show", help="Print an audit's state, verdict and culprits.")
        show.add_argument("audit", type=int)
        rep = sub.add_parser("report", help="Write an audit's report.")
        rep.add_argument("audit", type=int)
        rep.add_argument("--pdf", metavar="PATH", help="Write the PDF here (default: the JSON to stdout).")

    def handle(self, *args, action, **options):
        try:
            if action == "start":
                return self._start(**options)
            run = self._run(options["audit"])
            with scoping.for_organization(run.organization_id):
                if action == "show":
                    self._show(run)
                elif options["pdf"]:
                    with open(options["pdf"], "wb") as fh:
                        fh.write(report.pdf(run))
                    self.stdout.write(f"wrote {options['pdf']}")
                else:
                    self.stdout.write(json.dumps(report.document(run), indent=1))
        except DomainError as exc:
            raise CommandError(exc.detail) from None

    def _run(self, pk: int) -> AuditRun:
        with scoping.unscoped("an operator on the console host names an audit by id"):
            run = AuditRun.objects.select_related("cluster").filter(pk=pk).first()
        if run is None:
            raise CommandError(f"no audit with id {pk}")
        return run

    def _start(self, cluster, node, options, wait, timeout, **_):
        with scoping.unscoped("an operator on the console host names a cluster by id"):
            target = Cluster.objects.filter(pk=cluster).first()
        if target is None:
            raise CommandError(f"no cluster with id {cluster}")
        try:
            parsed = json.loads(options)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--options is not JSON: {exc}") from None
        with scoping.for_organization(target.organization_id):
            node_ids = None
            if node:
                found = dict(Node.objects.filter(cluster=target, name__in=node).values_list("name", "pk"))
                missing = sorted(set(node) - set(found))
                if missing:
                    raise CommandError(f"not nodes of cluster {target.name}: {', '.join(missing)}")
                node_ids = [found[n] for n in node]
            run, created = services.start_audit(target, node_ids=node_ids, options=parsed)
            self.stdout.write(f"audit {run.pk} of {target.name} {'started' if created else 'already started'}")
            if not wait:
                return
            deadline = time.monotonic() + timeout
            while True:
                run.refresh_from_db()
                self._progress(run)
                if run.state != RunState.RUNNING:
                    break
                if time.monotonic() > deadline:
                    raise CommandError(f"audit {run.pk} still running after {timeout:.0f} s")
                time.sleep(1)
            self.stdout.write("")
            self._show(run)
            if run.verdict == "fail":
                sys.exit(2)

    def _progress(self, run: AuditRun) -> None:
        outcomes = list(run.nodes.values_list("outcome", flat=True))
        done = sum(o != NodeOutcome.PENDING for o in outcomes)
        total = len(outcomes) or 1
        phase_share = {"nodes": 0.5, "load": 0.9, "done": 1.0}[run.phase]
        share = phase_share if run.phase != "nodes" else 0.5 * done / total
        filled = int(BAR * share)
        self.stdout.write(f"\r[{'#' * filled}{'.' * (BAR - filled)}] {run.get_phase_display():<18} "
                          f"{done}/{len(outcomes)} nodes checked", ending="")
        self.stdout.flush()

    def _show(self, run: AuditRun) -> None:
        self.stdout.write(f"audit {run.pk} of {run.cluster.name}: {run.state}"
                          + (f", verdict {run.verdict}" if run.verdict else f", phase {run.phase}"))
        for c in (run.report or {}).get("culprits", []):
            reasons = "; ".join(f"{r['code']}: {r['message']}" for r in c["reasons"])
            self.stdout.write(f"  culprit {c['kind']} {c['name']}: {reasons}")
        for name in (run.report or {}).get("not_audited", []):
            self.stdout.write(f"  not audited: {name}")
