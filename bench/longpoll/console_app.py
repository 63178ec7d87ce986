"""The console's ASGI application, unchanged, plus one read-only stats route for the benchmark.

`uvicorn bench.longpoll.console_app:application` serves exactly `console.asgi.application`; it
only counts the HTTP requests in flight (agent long polls apart) and answers
`GET /__bench__/stats` with what the console process holds right now:

    {"polls_in_flight": ..., "requests_in_flight": ..., "poll_waiters": ...,
     "db_queue": ..., "db_threads": ..., "delivery_queue": ..., "loop_lag_max_ms": ..., "pid": ...}

`poll_waiters` are polls registered for wake-ups (console.commands.wakeup), `db_queue` the ORM
calls waiting for a thread of console.core.asyncdb, `delivery_queue` the claims waiting for one
of its delivery threads, `loop_lag_max_ms` the worst event-loop
delay since the previous stats request (a 50 ms timer, late by that much).
"""

from __future__ import annotations

import asyncio
import json
import os

from console.asgi import application as console_application
from console.commands import wakeup
from console.core import asyncdb

POLL_PATH = "/api/v1/agent/commands"
STATS_PATH = "/__bench__/stats"
_counts = {"polls_in_flight": 0, "requests_in_flight": 0}
_lag = {"max": 0.0}
_watchdog: asyncio.Task | None = None


async def _watch_loop_lag(period: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(period)
        late = loop.time() - started - period
        if late > _lag["max"]:
            _lag["max"] = late


def stats() -> dict:
    executor, delivery = asyncdb._executor, asyncdb._delivery_executor
    lag, _lag["max"] = _lag["max"], 0.0
    return {
        **_counts,
        "poll_waiters": wakeup.waiters.count(),
        "db_queue": executor._work_queue.qsize(),
        "db_threads": len(executor._threads),
        "delivery_queue": delivery._work_queue.qsize(),
        "loop_lag_max_ms": round(lag * 1000, 1),
        "pid": os.getpid(),
    }


async def application(scope, receive, send):
    global _watchdog
    if scope["type"] != "http":
        return await console_application(scope, receive, send)
    if _watchdog is None or _watchdog.done():
        _watchdog = asyncio.get_running_loop().create_task(_watch_loop_lag())
    if scope["path"] == STATS_PATH:
        body = json.dumps(stats()).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return None
    key = "polls_in_flight" if scope["path"] == POLL_PATH else "requests_in_flight"
    _counts[key] += 1
    try:
        return await console_application(scope, receive, send)
    finally:
        _counts[key] -= 1
