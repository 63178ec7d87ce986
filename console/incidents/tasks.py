from celery import shared_task

from console.core import scoping
from console.incidents import services


@shared_task(name="console.incidents.tasks.triangulate_probe_window", ignore_result=True)
def triangulate_probe_window(organization_id: int, window_id: int) -> None:
    """Triangulate one complete (or overdue) probe window and update the cluster's incidents."""
    with scoping.for_organization(organization_id):
        services.triangulate_window(window_id)


@shared_task(name="console.incidents.tasks.sweep_probe_windows", ignore_result=True)
def sweep_probe_windows() -> int:
    """Periodic: windows left filling after every agent of a cluster went quiet are triangulated."""
    with scoping.unscoped("queue the stale probe windows of every organization"):
        return len(services.queue_stale_windows())


@shared_task(name="console.incidents.tasks.refresh_probe_plans", ignore_result=True)
def refresh_probe_plans() -> int:
    """Periodic: re-push the probe plan of every cluster whose topology or members changed."""
    with scoping.unscoped("re-plan the probe mesh of every organization's changed clusters"):
        return len(services.refresh_probe_plans())
