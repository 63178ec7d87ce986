from celery import shared_task

from console.commands import dispatch


@shared_task(name="console.commands.tasks.requeue_expired_commands", ignore_result=True)
def requeue_expired_commands() -> int:
    """Periodic: offer again (or expire) commands whose delivery lease ended without a result."""
    return dispatch.requeue_expired()
