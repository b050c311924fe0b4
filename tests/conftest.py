"""Fixtures shared across test packages."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from kubegpu.testing.apiserver import FakeApiServer, ServerThread


@pytest.fixture
def fake_api_server() -> Iterator[ServerThread]:
    """A fresh fake Kubernetes API server (real HTTP on a loopback port) for one test."""
    with FakeApiServer().run_in_thread() as handle:
        yield handle


# Threads a test may leave behind, by name prefix, and why they are not leaks.
LONG_LIVED_THREADS = (
    # asyncio's default executor (run_in_executor / to_thread): loop.close() shuts it down
    # without waiting, so its idle workers exit just after the test's loop is gone.
    "asyncio_",
)
# How long a thread or task a test stopped may take to finish before it counts as left behind
# (threads are joined and tasks awaited for this long, not slept on).
LEFTOVER_GRACE_S = 5.0


@pytest.fixture(autouse=True)
def no_leftover_threads_or_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a non-daemon thread or an asyncio task running.

    Fixtures of a wider scope (module, session) are set up before this one, so their threads
    count as already there. Async tests get their task check from
    :func:`_no_leftover_tasks`, requested here so that it is torn down after every other
    fixture of the test.
    """
    before = set(threading.enumerate())
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("_no_leftover_tasks")
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    left = []
    for thread in threading.enumerate():
        if thread in before or thread.daemon or thread is threading.current_thread():
            continue
        if thread.name.startswith(LONG_LIVED_THREADS):
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if left:
        pytest.fail(f"non-daemon threads left running: {left}")


@pytest.fixture
async def _no_leftover_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    leftover = {t for t in asyncio.all_tasks() if t is not current and not t.done()}
    if leftover:
        # Tasks the test cancelled may need a few loop turns to unwind.
        await asyncio.wait(leftover, timeout=LEFTOVER_GRACE_S)
        names = sorted(t.get_name() + " " + repr(t.get_coro()) for t in leftover if not t.done())
        if names:
            pytest.fail(f"asyncio tasks left running: {names}")
