"""The Celery app. With REDIS_URL unset, tasks run eagerly in the calling process."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("lockstep")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
