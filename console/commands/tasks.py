from celery import shared_task

from console.commands import services
from console.core import scoping


@shared_task(name="console.commands.tasks.requeue_expired_commands", ignore_result=True)
def requeue_expired_commands() -> int:
    """Periodic: offer again (or expire) commands whose delivery lease ended without a result."""
    with scoping.unscoped("requeue the expired command leases of every organization"):
        return services.requeue_expired()
