"""The Celery app. With REDIS_URL unset, tasks run eagerly in the calling process.

Every task starts with no tenant scope (`ClosedScopeTask`), wherever it runs: a task says which
organization it works for (`with for_organization(organization_id):`, the id passed as an
argument) or that it works across all of them (`with unscoped("why"):`).
"""

import os

from celery import Celery, Task

from console.core import scoping

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")


class ClosedScopeTask(Task):
    def __call__(self, *args, **kwargs):
        with scoping.closed():
            return super().__call__(*args, **kwargs)


app = Celery("lockstep", task_cls=ClosedScopeTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
