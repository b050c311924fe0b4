"""The extender collects its young generations itself, between verbs, and keeps the old one
frozen (``kubegpu.extender.collector``): automatic collections, set off by a net count that the
extender's one-for-one churn barely moves, scanned tens of thousands of survivors inside a verb
(issue 32's soak at 5,000 nodes)."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from kubegpu.extender import collector, refresh
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import gpu_node, running_extender
from tests.extender.test_abuse import metric


class Cyclic:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's heap goes back under the collector


@pytest.fixture
def counted_collections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    generations: list[int] = []
    real_collect = gc.collect

    def counting_collect(generation: int = 2) -> int:
        generations.append(generation)
        return real_collect(generation)

    monkeypatch.setattr(collector.gc, "collect", counting_collect)
    return generations


def garbage_cycle() -> weakref.ref[Cyclic]:
    return weakref.ref(Cyclic())


async def stop(task: asyncio.Task[None], stopped: asyncio.Future[bool]) -> None:
    stopped.set_result(True)
    await asyncio.wait_for(task, 1.0)


async def test_a_garbage_cycle_is_collected_within_an_interval_with_automatic_collection_held_off(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collector, "COLLECT_EVERY_S", 0.02)
    before = gc.get_threshold()
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(collector.collect_between_verbs(lambda: True, stopped))
    await asyncio.sleep(0.01)
    assert gc.get_threshold() == (collector.SAFETY_THRESHOLD, *before[1:])
    dead = garbage_cycle()
    assert dead() is not None  # the automatic collector did not get to it
    await wait_until_async(lambda: dead() is None, timeout_s=10, what="the cycle collected")
    await stop(task, stopped)
    assert gc.get_threshold() == before


async def test_no_collection_while_a_verb_is_served_until_the_wait_runs_out(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch, counted_collections: list[int]
) -> None:
    monkeypatch.setattr(collector, "COLLECT_EVERY_S", 0.01)
    monkeypatch.setattr(collector, "COLLECT_WAIT_MAX_S", 0.3)
    serving = True
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    started = time.monotonic()
    task = asyncio.create_task(collector.collect_between_verbs(lambda: not serving, stopped))
    await asyncio.sleep(0.1)
    assert counted_collections == []  # busy, and the wait has not run out
    # A loop that is never idle still collects, once the wait has run out.
    await wait_until_async(lambda: counted_collections, timeout_s=10, what="a collection")
    assert time.monotonic() - started >= 0.3
    serving = False
    # Idle: every interval, and the young generations only.
    await wait_until_async(
        lambda: len(counted_collections) >= 5, timeout_s=10, what="collections while idle"
    )
    assert set(counted_collections) == {1}
    await stop(task, stopped)


async def test_the_old_generation_is_frozen_at_once_and_again_each_interval(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collector, "COLLECT_EVERY_S", 0.01)
    monkeypatch.setattr(collector, "REFREEZE_S", 0.1)
    freezes: list[tuple[float, int]] = []  # when, and the frozen count after
    real_freeze = gc.freeze

    def counting_freeze() -> None:
        real_freeze()
        freezes.append((time.monotonic(), gc.get_freeze_count()))

    monkeypatch.setattr(collector.gc, "freeze", counting_freeze)
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(collector.collect_between_verbs(lambda: True, stopped))
    await wait_until_async(lambda: freezes, timeout_s=10, what="the first freeze")
    made_since = [[k] for k in range(1000)]  # containers, which the collector tracks
    await wait_until_async(lambda: len(freezes) >= 2, timeout_s=10, what="a second freeze")
    await stop(task, stopped)
    (first_at, first_count), (second_at, second_count) = freezes[:2]
    # Not at every young collection (every 10 ms): once the interval has passed.
    assert second_at - first_at >= 0.1
    # The second took what was made since the first.
    assert second_count >= first_count + len(made_since)


async def test_stopping_ends_it_without_waiting_out_an_interval(unfrozen: None) -> None:
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    stopped.set_result(True)
    await asyncio.wait_for(collector.collect_between_verbs(lambda: False, stopped), 1.0)


async def test_no_collection_while_a_refresh_builds_then_one_soon_after(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch, counted_collections: list[int]
) -> None:
    # A workload refresh pauses the collector while its thread builds an engine; a young
    # collection then would scan the build's objects on the event loop.
    monkeypatch.setattr(collector, "COLLECT_EVERY_S", 0.02)
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    with refresh.collector_paused():
        task = asyncio.create_task(collector.collect_between_verbs(lambda: True, stopped))
        await asyncio.sleep(0.1)
        assert counted_collections == []
    await wait_until_async(lambda: counted_collections, timeout_s=10, what="a collection")
    assert counted_collections[0] == 1  # the build over: collected
    await stop(task, stopped)


async def test_the_frozen_heap_size_is_served_as_a_metric(unfrozen: None) -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a"))
        async with running_extender(server) as ext:
            assert await metric(ext, "kubegpu_extender_heap_frozen_objects ") == 0
            gc.freeze()
            frozen = gc.get_freeze_count()
            assert frozen > 0
            served = await metric(ext, "kubegpu_extender_heap_frozen_objects ")
            # Read when served: frozen objects freed since (by reference count) leave it.
            assert 0.9 * frozen <= served <= frozen
