"""console.core.asyncdb: command delivery has threads of its own; LoopSlots bounds holders per loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from console.core import asyncdb
from console.core.asyncdb import LoopSlots, run_db, run_db_for_delivery


def test_no_more_than_size_holders_run_at_once():
    slots = LoopSlots(2)
    inside, most = 0, 0

    async def hold():
        nonlocal inside, most
        async with slots():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    async def main():
        await asyncio.gather(*(hold() for _ in range(7)))

    asyncio.run(main())
    assert most == 2 and inside == 0


def test_each_event_loop_gets_its_own_slots():
    slots = LoopSlots(1)

    async def take_and_keep():
        await slots().acquire()  # never released: that loop's slot stays taken

    asyncio.run(take_and_keep())
    # A second loop is not blocked by the first one's slot, nor refused as "bound to another loop".
    asyncio.run(asyncio.wait_for(take_and_keep(), 1))


def test_a_size_below_one_is_refused():
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        LoopSlots(0)


def test_a_delivery_runs_while_every_general_database_thread_is_busy(settings):
    settings.LOCKSTEP = {**settings.LOCKSTEP, "DB_THREAD_POOL": True}
    release = threading.Event()

    def busy():
        return release.wait(10)  # a slow heartbeat or telemetry batch holding a thread

    async def main():
        general = [asyncio.ensure_future(run_db(busy)) for _ in range(asyncdb._executor._max_workers + 3)]
        await asyncio.sleep(0.05)
        try:
            delivered = await asyncio.wait_for(run_db_for_delivery(threading.current_thread), 2)
            assert not any(task.done() for task in general), "the general threads were meant to be busy"
        finally:
            release.set()
        assert all(await asyncio.gather(*general))
        return delivered.name

    assert asyncio.run(main()).startswith("lockstep-db-delivery")
