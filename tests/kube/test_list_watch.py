"""The one list-then-watch loop: what it waits after a failure."""

from __future__ import annotations

import asyncio

import pytest

from kubegpu.kube.list_watch import Backoff, keep_listing_and_watching

BACKOFF = Backoff(initial_s=1.0, max_s=30.0)


async def run_loop(progress: list[bool]) -> tuple[list[float], int]:
    """Each watch fails with a reset connection, having moved the version on or not (one
    entry of ``progress`` per watch); returns the pauses slept and the relists."""
    versions: dict[str, str | None] = {"pods": None}
    steps = iter(progress)
    slept: list[float] = []
    relists = 0

    async def relist() -> str:
        nonlocal relists
        relists += 1
        return "10"

    async def watch() -> None:
        moved = next(steps, None)
        if moved is None:
            raise asyncio.CancelledError  # the scenario is over
        if moved:
            versions["pods"] = str(int(versions["pods"] or 0) + 1)
        raise ConnectionResetError("peer reset")

    async def sleep(delay: float) -> None:
        slept.append(delay)

    with pytest.raises(asyncio.CancelledError):
        await keep_listing_and_watching("pods", versions, relist, watch, BACKOFF, sleep)
    return slept, relists


async def test_failures_in_a_row_without_progress_back_off_further_each_time() -> None:
    slept, relists = await run_loop([False, False, False, False])
    assert slept == [1.0, 2.0, 4.0, 8.0]
    assert relists == 1  # a broken connection resumes; only the start lists


async def test_a_watch_that_moved_the_version_on_before_failing_starts_the_backoff_over() -> None:
    # A watch failing once a minute after delivering events (as one breaking on each of the
    # server's bookmarks once did) must not creep up to the 30 s ceiling.
    slept, _ = await run_loop([False, False, True, True, False])
    assert slept == [1.0, 2.0, 1.0, 1.0, 2.0]
