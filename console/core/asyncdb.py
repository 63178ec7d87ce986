"""Run ORM work from async views on a bounded pool of threads.

Django runs sync code called from async views on one shared thread by default
(`thread_sensitive=True`), which would serialize every agent request of the process. Agent
endpoints do self-contained, transactional work, so they run on this pool instead; command
claims (`run_db_for_delivery`) on a small pool of their own, so delivery never queues behind
other agent work.

Each pool thread keeps its own connection for as long as it lives, whatever `CONN_MAX_AGE`
says (that setting is for request threads, which under ASGI are new for every request). A
connection is checked (`SELECT 1`) only when it may be broken: after a database error, or
after it sat idle for `IDLE_CHECK_S`; and it is replaced after `LOCKSTEP_DB_THREAD_CONN_MAX_AGE_S`.
Checking before every call, as `close_old_connections()` does with health checks on, costs a
round trip per call: a third of all queries of an idle long poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from console.env import env_int

IDLE_CHECK_S = 30.0
MAX_AGE_S = env_int("LOCKSTEP_DB_THREAD_CONN_MAX_AGE_S", 300)

_executor = ThreadPoolExecutor(
    max_workers=env_int("LOCKSTEP_DB_THREADS", 8), thread_name_prefix="lockstep-db"
)
# Command delivery has threads of its own: a woken poll's claim never queues behind a burst of
# heartbeats, telemetry or re-enrollments (those can wait; a command should not).
_delivery_executor = ThreadPoolExecutor(
    max_workers=env_int("LOCKSTEP_DB_DELIVERY_THREADS", 2), thread_name_prefix="lockstep-db-delivery"
)
_local = threading.local()


def _keep_connection_usable() -> None:
    """Close this thread's connection if it is broken, stale or old; the next query reconnects."""
    if connection.connection is None:
        _local.opened = None
        return
    now = time.monotonic()
    opened = getattr(_local, "opened", None)
    if opened is None:
        opened = _local.opened = now
    if (
        not connection.get_autocommit()  # a transaction was left open: do not reuse it
        or now - opened >= MAX_AGE_S
        or ((connection.errors_occurred or now - getattr(_local, "used", now) >= IDLE_CHECK_S)
            and not connection.is_usable())
    ):
        connection.close()
        _local.opened = None
    else:
        connection.errors_occurred = False
    _local.used = now


def _with_connection(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        _keep_connection_usable()
        return fn(*args, **kwargs)

    return run


async def run_db(fn, *args, **kwargs):
    """Await `fn(*args, **kwargs)` run on the database thread pool."""
    return await _run(_executor, fn, args, kwargs)


async def run_db_for_delivery(fn, *args, **kwargs):
    """`run_db` on the threads reserved for command delivery."""
    return await _run(_delivery_executor, fn, args, kwargs)


async def _run(executor: ThreadPoolExecutor, fn, args, kwargs):
    if not settings.LOCKSTEP["DB_THREAD_POOL"]:
        # Tests that wrap each test in one transaction need the work on the test's own thread.
        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)
    return await sync_to_async(_with_connection(fn), thread_sensitive=False, executor=executor)(*args, **kwargs)


class NoSlot(Exception):
    """Every slot stayed taken for as long as the caller would wait."""


class FairSlots:
    """At most `size` holders at once, per event loop: `async with slots.within(group, timeout):`.
    When a slot frees, it goes to a waiter of the group (an organization) that holds the fewest
    slots and was served longest ago, its longest waiting first: turns go round the groups, so a
    group with many waiters does not make another group's one waiter wait behind all of them.
    (Per loop: uvicorn has one loop, tests many.)"""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SlotState] = (
            weakref.WeakKeyDictionary()
        )

    def _state(self) -> _SlotState:
        loop = asyncio.get_running_loop()
        state = self._by_loop.get(loop)
        if state is None:
            state = self._by_loop[loop] = _SlotState()
        return state

    @contextlib.asynccontextmanager
    async def within(self, group, timeout: float):
        """Hold a slot for `group`, waiting at most `timeout` seconds for one (else NoSlot)."""
        state = self._state()
        turn = asyncio.get_running_loop().create_future()
        state.waiting.append((next(state.order), group, turn))
        self._hand_out(state)
        try:
            await asyncio.wait_for(asyncio.shield(turn), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            if turn.done() and not turn.cancelled():
                self._release(state, group)  # the slot came at the same moment: give it on
            else:
                turn.cancel()
                state.waiting = [w for w in state.waiting if w[2] is not turn]
            if asyncio.current_task().cancelling():
                raise
            raise NoSlot(f"no slot free within {timeout} s") from None
        try:
            yield
        finally:
            self._release(state, group)

    def _release(self, state: _SlotState, group) -> None:
        state.held -= 1
        state.by_group[group] -= 1
        if state.by_group[group] <= 0:
            del state.by_group[group]
        self._hand_out(state)

    def _hand_out(self, state: _SlotState) -> None:
        state.waiting = [w for w in state.waiting if not w[2].done()]
        while state.waiting and state.held < self.size:
            chosen = min(state.waiting, key=lambda w: (state.by_group.get(w[1], 0), state.served.get(w[1], -1), w[0]))
            state.waiting.remove(chosen)
            state.served[chosen[1]] = next(state.order)
            state.held += 1
            state.by_group[chosen[1]] = state.by_group.get(chosen[1], 0) + 1
            chosen[2].set_result(None)


class _SlotState:
    def __init__(self) -> None:
        self.held = 0
        self.by_group: dict = {}
        self.served: dict = {}  # group -> when it was last given a slot (an `order` number)
        self.waiting: list[tuple[int, object, asyncio.Future]] = []
        self.order = itertools.count()
