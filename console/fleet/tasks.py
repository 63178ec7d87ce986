from celery import shared_task

from console.fleet import lifecycle


@shared_task(name="console.fleet.tasks.sweep_lost_nodes", ignore_result=True)
def sweep_lost_nodes() -> int:
    """Periodic: mark nodes whose agents went silent as lost."""
    return lifecycle.sweep_lost()
