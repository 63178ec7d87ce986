"""Wake long-polling agents when a command is queued for their node.

Each console process keeps, per node, the asyncio events of the polls it is holding. `notify`
sets them directly (same process) and, when Redis is configured, publishes the node id so
every other console process (and commands issued from Celery workers) wakes its own waiters.
A missed wake-up costs at most one sweep period, never a lost command: the database is the
source of truth, the wake-up only shortens the wait. The sweep (`_Sweeper`) is the backstop:
every AGENT_POLL_RECHECK_S, one query per event loop finds the nodes whose waiting polls have
work after all and wakes them, however many polls are waiting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import defaultdict

from django.conf import settings

log = logging.getLogger(__name__)
CHANNEL = "lockstep:wake:node"


class _Waiters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)

    def add(self, node_id: int) -> tuple[asyncio.AbstractEventLoop, asyncio.Event]:
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._by_node[node_id].add(entry)
        return entry

    def remove(self, node_id: int, entry) -> None:
        with self._lock:
            waiting = self._by_node.get(node_id)
            if waiting is not None:
                waiting.discard(entry)
                if not waiting:
                    del self._by_node[node_id]

    def wake(self, node_id: int) -> None:
        with self._lock:
            entries = list(self._by_node.get(node_id, ()))
        for loop, event in entries:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    def nodes(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        """Nodes with a poll waiting on this event loop."""
        with self._lock:
            return [node_id for node_id, entries in self._by_node.items() if any(lp is loop for lp, _ in entries)]

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_node.values())

    def wake_all(self) -> None:
        with self._lock:
            entries = [entry for waiting in self._by_node.values() for entry in waiting]
        for loop, event in entries:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)


waiters = _Waiters()
# Set when the server is shutting down: held polls answer now and new ones do not wait, so a
# graceful shutdown is not spent waiting (then cancelling) polls held for up to a minute.
_draining = False
_publisher = None
_publisher_lock = threading.Lock()
# One listener task per event loop (uvicorn has one; tests create many): weak, so a closed
# loop and its task are not kept alive.
_listeners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task] = weakref.WeakKeyDictionary()


def drain() -> None:
    """The server is stopping: answer every held poll now (empty) and hold no new ones."""
    global _draining
    _draining = True
    waiters.wake_all()


def notify(node_id: int) -> None:
    """Wake every poll waiting for this node, in this process and (with Redis) in the others."""
    waiters.wake(node_id)
    if settings.REDIS_URL:
        try:
            _redis().publish(CHANNEL, str(node_id))
        except Exception as exc:  # the poll's re-check delivers it anyway, a little later
            log.warning("event=wakeup_publish_failed node=%s error=%r", node_id, exc)


class _Listener:
    """Registered for wake-ups from entry to exit; `wait` can be called repeatedly."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.entry = None

    async def __aenter__(self) -> _Listener:
        _ensure_listener()
        _sweeper.ensure()
        self.entry = waiters.add(self.node_id)
        return self

    async def __aexit__(self, *exc_info) -> None:
        waiters.remove(self.node_id, self.entry)

    async def wait(self, timeout: float) -> bool:
        """True when notified within `timeout` seconds; False at once while the server drains."""
        if _draining:
            return False
        event = self.entry[1]
        try:
            await asyncio.wait_for(event.wait(), timeout)
            return not _draining
        except asyncio.TimeoutError:
            return False
        finally:
            event.clear()


def listen(node_id: int) -> _Listener:
    return _Listener(node_id)


class _Sweeper:
    """Wakes polls whose wake-up was missed (a command queued by a process without Redis, a
    lease that ended): one timer and one query per event loop and AGENT_POLL_RECHECK_S, instead
    of a timer and a query per waiting poll. It stops when no poll waits on the loop."""

    def __init__(self) -> None:
        self._loops: weakref.WeakSet = weakref.WeakSet()  # loops with a sweep scheduled
        self._tasks: set[asyncio.Task] = set()

    def ensure(self) -> None:
        if not settings.LOCKSTEP["DB_THREAD_POOL"]:
            # In-process tests run ORM work on the test's own thread: a sweep still waiting for
            # it when the test's event loop closes would never finish. They need no backstop.
            return
        loop = asyncio.get_running_loop()
        if loop not in self._loops:
            self._loops.add(loop)
            loop.call_later(settings.LOCKSTEP["AGENT_POLL_RECHECK_S"], self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        nodes = waiters.nodes(loop)
        if not nodes:
            self._loops.discard(loop)
            return
        task = loop.create_task(self._sweep(loop, nodes))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep(self, loop: asyncio.AbstractEventLoop, nodes: list[int]) -> None:
        from console.core.asyncdb import run_db

        try:
            due = await run_db(_nodes_with_work, nodes)
        except Exception as exc:  # the next sweep tries again
            log.warning("event=poll_sweep_failed nodes=%d error=%r", len(nodes), exc)
            due = ()
        for node_id in due:
            waiters.wake(node_id)
        loop.call_later(settings.LOCKSTEP["AGENT_POLL_RECHECK_S"], self._tick, loop)


def _nodes_with_work(nodes: list[int]) -> set[int]:
    from console.commands.services import nodes_with_work
    from console.core import scoping

    with scoping.unscoped("re-check the polls this process holds, whatever their organization"):
        return nodes_with_work(nodes)


_sweeper = _Sweeper()


def _redis():
    global _publisher
    if _publisher is None:
        import redis

        with _publisher_lock:
            if _publisher is None:
                _publisher = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
    return _publisher


def _ensure_listener() -> None:
    if not settings.REDIS_URL:
        return
    loop = asyncio.get_running_loop()
    task = _listeners.get(loop)
    if task is None or task.done():
        _listeners[loop] = loop.create_task(_listen())


async def _listen() -> None:
    import redis.asyncio as aioredis

    backoff = 0.5
    # redis-py can swallow a cancellation that arrives while it connects (the task's cancelling()
    # count stays up): the loops check it too, or the listener would keep its event loop from
    # ever closing (each test request of Django's client runs on a loop of its own).
    while not _being_cancelled():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            pubsub = client.pubsub()
            await pubsub.subscribe(CHANNEL)
            backoff = 0.5
            while not _being_cancelled():
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message.get("type") == "message":
                    try:
                        waiters.wake(int(message["data"]))
                    except ValueError:
                        log.warning("event=wakeup_bad_message data=%r", message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _being_cancelled():
                return
            log.warning("event=wakeup_listener_error error=%r retry_in=%.1fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)
        finally:
            await client.aclose()


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
