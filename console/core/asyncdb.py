"""Run ORM work from async views on a bounded pool of threads.

Django runs sync code called from async views on one shared thread by default
(`thread_sensitive=True`), which would serialize every agent request of the process. Agent
endpoints do self-contained, transactional work, so they run on this pool instead; each
thread keeps its own connection, health-checked before use.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from console.env import env_int

_executor = ThreadPoolExecutor(
    max_workers=env_int("LOCKSTEP_DB_THREADS", 8), thread_name_prefix="lockstep-db"
)


def _with_fresh_connection(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        close_old_connections()
        return fn(*args, **kwargs)

    return run


async def run_db(fn, *args, **kwargs):
    """Await `fn(*args, **kwargs)` run on the database thread pool."""
    if not settings.LOCKSTEP["DB_THREAD_POOL"]:
        # Tests that wrap each test in one transaction need the work on the test's own thread.
        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)
    return await sync_to_async(_with_fresh_connection(fn), thread_sensitive=False, executor=_executor)(
        *args, **kwargs
    )
