"""The extender process keeps its long-lived heap frozen (``kubegpu.cli.extender``): Python's full
collections, which pause every verb, then scan only what came since the last freeze (issue 32:
100-580 ms pauses at 5,000 nodes)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from kubegpu.cli import extender as cli
from kubegpu.extender import refresh


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's heap goes back under the collector


async def test_the_heap_is_frozen_at_once_and_again_each_interval(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "REFREEZE_S", 0.05)
    freezes: list[int] = []
    real_freeze = gc.freeze

    def counting_freeze() -> None:
        real_freeze()
        freezes.append(gc.get_freeze_count())

    monkeypatch.setattr(cli.gc, "freeze", counting_freeze)
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    keeper = asyncio.create_task(cli._keep_heap_frozen(stopped))
    await asyncio.sleep(0.18)
    assert not keeper.done()
    made_since = [[k] for k in range(1000)]  # containers, which the collector tracks
    await asyncio.sleep(0.1)
    stopped.set_result(True)
    await asyncio.wait_for(keeper, 1.0)
    assert len(freezes) >= 3  # once at the start, then every interval
    # A later freeze took what was made since the first.
    assert freezes[-1] >= freezes[0] + len(made_since)


async def test_stopping_ends_the_keeper_without_waiting_out_the_interval(
    unfrozen: None,
) -> None:
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    stopped.set_result(True)
    await asyncio.wait_for(cli._keep_heap_frozen(stopped), 1.0)  # REFREEZE_S is 60 s
    assert gc.get_freeze_count() > 0


async def test_no_collection_or_freeze_while_a_refresh_builds_then_one_soon_after(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A workload refresh pauses the collector while its thread builds an engine; a young
    # collection then would scan the build's objects on the event loop.
    monkeypatch.setattr(cli, "REFREEZE_RETRY_S", 0.02)
    collections: list[int] = []
    real_collect = gc.collect

    def counting_collect(generation: int = 2) -> int:
        collections.append(generation)
        return real_collect(generation)

    monkeypatch.setattr(cli.gc, "collect", counting_collect)
    stopped: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    with refresh.collector_paused():
        keeper = asyncio.create_task(cli._keep_heap_frozen(stopped))
        await asyncio.sleep(0.1)
        assert collections == []  # REFREEZE_S is 60 s: only the start's would have run
    await asyncio.sleep(0.1)
    assert collections == [1]  # the build over: collected and frozen within a retry
    stopped.set_result(True)
    await asyncio.wait_for(keeper, 1.0)
