from celery import shared_task

from console.core import scoping
from console.fleet import services


@shared_task(name="console.fleet.tasks.sweep_lost_nodes", ignore_result=True)
def sweep_lost_nodes() -> int:
    """Periodic: mark nodes whose agents went silent as lost."""
    with scoping.unscoped("sweep the silent nodes of every organization"):
        return services.sweep_lost()
