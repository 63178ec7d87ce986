from celery import shared_task

from console.clocks import services
from console.clocks.models import ClockSync
from console.core import scoping


@shared_task(name="console.clocks.tasks.solve_clocks", ignore_result=True)
def solve_clocks(organization_id: int, cluster_id: int) -> int:
    """The network solve of one cluster (queued by the clock.estimate handler); nodes synced."""
    with scoping.for_organization(organization_id):
        solution = services.solve(cluster_id)
        return len(solution.nodes) if solution is not None else 0


@shared_task(name="console.clocks.tasks.replan_and_sweep", ignore_result=True)
def replan_and_sweep() -> int:
    """Periodic: every cluster running clock sync gets a new graph when its nodes changed, stale nodes marked."""
    with scoping.unscoped("clock sync: find the clusters running it"):
        placements = list(ClockSync.objects.filter(running=True).values_list("organization_id", "cluster_id"))
    for organization_id, cluster_id in placements:
        with scoping.for_organization(organization_id):
            sync = ClockSync.objects.filter(cluster_id=cluster_id, running=True).first()
            if sync is not None:
                services.sweep(sync)
    return len(placements)
