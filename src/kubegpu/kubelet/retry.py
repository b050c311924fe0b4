"""Retrying with a bounded exponential backoff given as data: the node agent's one retry rule.

Registration with the kubelet, re-creating a lost socket and publishing the inventory all retry
for ever (a node agent that stops trying leaves the node without GPUs), each with a delay
bounded so a kubelet or API server that comes back is noticed within ``max_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryBackoff:
    """Delay before retry ``attempt``, counted from 0: ``initial_s * factor**attempt``, capped.
    (The extender's watch counts failures from 1 instead: :class:`kubegpu.kube.view.Backoff`.)"""

    initial_s: float = 0.1
    factor: float = 2.0
    max_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))


async def retry_with_backoff(
    operation: Callable[[], Awaitable[T]],
    backoff: RetryBackoff,
    *,
    describe: str,
    sleep: Sleep = asyncio.sleep,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> T:
    """Run ``operation`` until it succeeds, sleeping ``backoff.delay(n)`` after failure n."""
    attempt = 0
    while True:
        try:
            return await operation()
        except retry_on as err:
            delay = backoff.delay(attempt)
            log.warning(
                "%s failed (attempt %d): %s; retrying in %.2fs",
                describe,
                attempt + 1,
                short_error(err),
                delay,
            )
            await sleep(delay)
            attempt += 1


def short_error(err: BaseException) -> str:
    """The first line of an error's message (a gRPC error's details), for one log line."""
    details = getattr(err, "details", None)
    text = details() if callable(details) else str(err)
    return str(text).splitlines()[0] if text else type(err).__name__
