"""Waiting for a condition that nothing announces: one polling loop, one failure message.

What a test waits for is, where it can be, announced: an :class:`asyncio.Event`, a task to
await, a thread to join, a fake clock to advance. What is left is what nothing can announce
in-process: another process (its log, its socket, its HTTP endpoint), or the state of a real
component that has no notification to offer (a view fed by a watch over real HTTP). Those are
polled here, and only here, so that every such wait has a deadline and fails by naming what it
waited for rather than as a bare ``TimeoutError`` or the suite's per-test timeout.

The deadlines are generous (the suite runs on loaded, shared machines); they bound a failure,
they do not time a success.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

# Between two looks at another process: short against a process's start-up (about a second),
# long enough not to spin on a machine shared by several test runs.
POLL_S = 0.05
# Between two looks at in-process state on the running loop: it changes only when the loop
# runs something else, so a short pause costs little and answers quickly.
ASYNC_POLL_S = 0.01


def _describe(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout_s: float,
    what: str | Callable[[], str],
    poll_s: float = POLL_S,
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Raise :class:`TimeoutError` naming ``what`` after ``timeout_s``; ``what`` may be a callable
    so that a process's log is read only when the wait fails. ``predicate`` may raise to give up
    early (say, because the process it waits on has exited)."""
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached in {timeout_s:g} s: {_describe(what)}")
        time.sleep(poll_s)
    return result


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float,
    what: str | Callable[[], str],
    poll_s: float = ASYNC_POLL_S,
) -> T:
    """:func:`wait_until` on the running loop: the loop runs other tasks between the looks.

    ``predicate`` may be a coroutine function (a scrape over HTTP, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        outcome = predicate()
        result: T = await outcome if inspect.isawaitable(outcome) else outcome
        if result:
            return result
        if loop.time() > deadline:
            raise TimeoutError(f"not reached in {timeout_s:g} s: {_describe(what)}")
        await asyncio.sleep(poll_s)
