"""The audits' Celery tasks: thin shells around console.audits.services."""

from celery import shared_task

from console.audits import services
from console.audits.models import AuditRun, AuditSchedule
from console.core import scoping


@shared_task(name="console.audits.tasks.advance_audit", ignore_result=True)
def advance_audit(organization_id: int, run_id: int) -> None:
    """One step of one audit (right after it starts, so its first commands go out at once)."""
    with scoping.for_organization(organization_id):
        run = AuditRun.objects.filter(pk=run_id).first()
        if run is not None:
            services.advance(run)


@shared_task(name="console.audits.tasks.advance_audits", ignore_result=True)
def advance_audits() -> int:
    """Periodic: one step of every running audit, each in its own organization."""
    with scoping.unscoped("find the running audits of every organization"):
        running = list(services.open_runs().values_list("organization_id", "pk"))
    for organization_id, run_id in running:
        advance_audit.apply(args=(organization_id, run_id))
    return len(running)


@shared_task(name="console.audits.tasks.start_scheduled_audits", ignore_result=True)
def start_scheduled_audits() -> int:
    """Periodic: start the audits that are due, each in its own organization."""
    with scoping.unscoped("find the due audit schedules of every organization"):
        due = list(AuditSchedule.objects.filter(enabled=True).values_list("organization_id", "pk"))
    started = 0
    for organization_id, schedule_id in due:
        with scoping.for_organization(organization_id):
            schedule = AuditSchedule.objects.select_related("cluster").filter(pk=schedule_id).first()
            if schedule is not None and services.start_due(schedule) is not None:
                started += 1
    return started
