"""The coordinator's reusable barrier with generations (in-process, on uvloop)."""

import asyncio

import pytest

from aiorl.runtime.barrier import Barrier, BarrierAborted


async def test_releases_only_when_every_participant_arrived():
    barrier = Barrier(["a", "b", "c"])
    released = []

    async def arrive(name, gen):
        await barrier.wait(name, gen)
        released.append((name, gen))

    async with asyncio.TaskGroup() as tg:
        tg.create_task(arrive("a", 0))
        tg.create_task(arrive("b", 0))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert released == []
        tg.create_task(arrive("c", 0))
    assert sorted(released) == [("a", 0), ("b", 0), ("c", 0)]
    assert barrier.last_released == 0


async def test_generations_reuse_and_fast_participant_does_not_leak():
    barrier = Barrier(["a", "b"])
    order = []

    async def worker(name, delay):
        for gen in range(5):
            await asyncio.sleep(delay)
            order.append((gen, "arrive", name))
            await barrier.wait(name, gen)
            order.append((gen, "leave", name))

    async with asyncio.TaskGroup() as tg:
        tg.create_task(worker("a", 0))
        tg.create_task(worker("b", 0.002))
    # Nobody leaves generation g before both arrived at g.
    for gen in range(5):
        arrivals = [i for i, e in enumerate(order) if e[0] == gen and e[1] == "arrive"]
        leaves = [i for i, e in enumerate(order) if e[0] == gen and e[1] == "leave"]
        assert max(arrivals) < min(leaves)


async def test_removing_a_dead_participant_releases_the_others():
    barrier = Barrier(["a", "b"])
    waiter = asyncio.create_task(barrier.wait("a", 0))
    await asyncio.sleep(0)
    assert not waiter.done()
    barrier.remove("b")
    await asyncio.wait_for(waiter, 1.0)


async def test_errors_and_abort():
    barrier = Barrier(["a", "b"])
    with pytest.raises(ValueError, match="not a participant"):
        await barrier.wait("z", 0)
    waiter = asyncio.create_task(barrier.wait("a", 1))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="arrived twice"):
        await barrier.wait("a", 1)
    barrier.abort("stopping")
    with pytest.raises(BarrierAborted, match="stopping"):
        await waiter
    with pytest.raises(BarrierAborted, match="stopping"):  # late arrivals do not wait
        await barrier.wait("b", 1)


async def test_already_released_generation_is_an_error():
    barrier = Barrier(["a"])
    await barrier.wait("a", 2)
    with pytest.raises(ValueError, match="already released"):
        await barrier.wait("a", 2)


async def test_a_participant_joining_at_a_later_generation_is_not_waited_for_before_it():
    barrier = Barrier(["a"])
    barrier.add("b", from_generation=1)  # a restarted actor joining the next iteration
    await asyncio.wait_for(barrier.wait("a", 0), 1.0)  # generation 0 does not wait for b
    waiting = asyncio.ensure_future(barrier.wait("a", 1))
    await asyncio.sleep(0)
    assert not waiting.done()  # generation 1 does
    await asyncio.wait_for(asyncio.gather(barrier.wait("b", 1), waiting), 1.0)
    with pytest.raises(ValueError, match="before the one it joins"):
        barrier.add("c", from_generation=5)
        await barrier.wait("c", 2)
