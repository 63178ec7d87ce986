"""console.core.asyncdb: command delivery has threads of its own; FairSlots bounds holders per loop, fairly."""

from __future__ import annotations

import asyncio
import threading

import pytest

from console.core import asyncdb
from console.core.asyncdb import FairSlots, run_db, run_db_for_delivery


def test_no_more_than_size_holders_run_at_once():
    slots = FairSlots(2)
    inside, most = 0, 0

    async def hold(group):
        nonlocal inside, most
        async with slots.within(group, 10):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    async def main():
        await asyncio.gather(*(hold(i % 3) for i in range(7)))

    asyncio.run(main())
    assert most == 2 and inside == 0


def test_a_freed_slot_goes_to_the_group_holding_the_fewest():
    # Group "a" queues five waiters before group "b" queues one: b's waiter gets the next turn.
    slots = FairSlots(1)
    order = []

    async def hold(group, i, gate):
        async with slots.within(group, 10):
            order.append(f"{group}{i}")
            await gate.wait()

    async def main():
        gate = asyncio.Event()
        first = asyncio.ensure_future(hold("a", 0, gate))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(hold("a", i, gate)) for i in range(1, 6)]
        waiting.append(asyncio.ensure_future(hold("b", 0, gate)))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(first, *waiting)

    asyncio.run(main())
    assert order[:2] == ["a0", "b0"] and sorted(order[2:]) == ["a1", "a2", "a3", "a4", "a5"]


def test_a_waiter_that_times_out_takes_nothing_and_the_next_one_gets_the_slot():
    slots = FairSlots(1)

    async def main():
        async with slots.within("a", 1):
            with pytest.raises(asyncdb.NoSlot):
                async with slots.within("b", 0.01):
                    pass
        async with slots.within("b", 0.5):  # the slot is free again, nothing leaked
            return True

    assert asyncio.run(main())


def test_each_event_loop_gets_its_own_slots():
    slots = FairSlots(1)

    async def take_and_keep():
        await slots.within("a", 1).__aenter__()  # never released: that loop's slot stays taken

    asyncio.run(take_and_keep())
    # A second loop is not blocked by the first one's slot, nor refused as "bound to another loop".
    asyncio.run(asyncio.wait_for(take_and_keep(), 1))


def test_a_size_below_one_is_refused():
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        FairSlots(0)


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
