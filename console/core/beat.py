"""Periodic tasks without a broker: with no REDIS_URL (embedded defaults) there is no Celery beat
or worker, so the console process runs CELERY_BEAT_SCHEDULE itself, on one thread."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

log = logging.getLogger(__name__)


class InProcessBeat(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="lockstep-beat", daemon=True)
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        from console.celery import app

        app.loader.import_default_modules()  # registers the autodiscovered tasks
        schedule = {
            name: (entry["task"], entry["schedule"].total_seconds())
            for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        }
        due = dict.fromkeys(schedule, time.monotonic())
        while not self._stop_event.is_set():
            now = time.monotonic()
            for name, (task, every) in schedule.items():
                if now >= due[name]:
                    due[name] = now + every
                    try:
                        app.tasks[task].apply()
                    except Exception:
                        log.exception("event=beat_task_failed task=%s", task)
            self._stop_event.wait(max(0.2, min(due.values()) - time.monotonic()))
