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
    return await sync_to_async(_with_fresh_connection(fn), thread_sensitive=False, executor=_executor)(
        *args, **kwargs
    )
