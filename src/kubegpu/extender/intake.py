"""Request bodies of the extender's verbs: read whole before a handler runs, within a size limit,
a read timeout and a byte budget shared by every request in flight.

Without them a client that announces a large body and sends it slowly (or never) holds a handler
and the bytes it read for as long as it likes: sixty unfinished 15 MiB bodies took the process
to its memory limit. Here a body over ``max_body_bytes`` is refused (413) as soon as that is
known, from its ``Content-Length`` or its running total; one that would take the bytes held by
all bodies past ``budget`` is refused at once (503, so kube-scheduler retries the pod later);
one not complete within ``timeout_s`` is answered 408. Refusals close the connection (the
rest of the body is never read), and the bytes a request held are given back when its handler
is done, whether it finished, failed or its client went away.

The request head has its own bound, set on the listener (``keepalive_timeout``, see
service.py): a connection that has not sent a whole head within it is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

BODY_KEY = web.RequestKey("kubegpu_body", bytes)


class BodyBudget:
    """Bytes of request bodies held at once, across every request; refuses what would exceed
    ``limit_bytes``."""

    def __init__(self, limit_bytes: int, gauge: Gauge | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._gauge = gauge

    def take(self, count: int) -> bool:
        if self.held_bytes + count > self.limit_bytes:
            return False
        self.held_bytes += count
        if self._gauge is not None:
            self._gauge.set(self.held_bytes)
        return True

    def give(self, count: int) -> None:
        self.held_bytes -= count
        if self._gauge is not None:
            self._gauge.set(self.held_bytes)


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class BodyIntake:
    """The aiohttp middleware that reads each POST body under the limits (see the module)."""

    def __init__(
        self,
        *,
        max_body_bytes: int,
        budget: BodyBudget,
        timeout_s: float,
        refused: Counter,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.budget = budget
        self.timeout_s = timeout_s
        self.refused = refused  # by reason: too-large, busy, timeout

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.method != "POST" or request.match_info.http_exception is not None:
            return await handler(request)  # no body to read (or 404/405 without reading it)
        held = [0]  # bytes taken from the budget for this request, given back below
        try:
            try:
                request[BODY_KEY] = await self._read(request, held)
            except _Refusal as refusal:
                return self._refuse(request, refusal)
            return await handler(request)
        finally:
            self.budget.give(held[0])

    async def _read(self, request: web.Request, held: list[int]) -> bytes:
        declared = request.content_length
        if declared is not None:
            self._check_size(declared)
            self._take(declared, held)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while chunk := await request.content.readany():
                    size += len(chunk)
                    self._check_size(size)
                    if declared is None:
                        self._take(len(chunk), held)
                    chunks.append(chunk)
        except TimeoutError:
            raise _Refusal(
                408,
                "timeout",
                f"request body not complete after {self.timeout_s:g} s "
                f"({size} of {declared if declared is not None else 'unknown'} bytes)",
            ) from None
        return b"".join(chunks)

    def _check_size(self, size: int) -> None:
        if size > self.max_body_bytes:
            raise _Refusal(
                413,
                "too-large",
                f"request body of {size} bytes or more is over max-body-bytes "
                f"({self.max_body_bytes}); with kube-scheduler's nodeCacheCapable: false, "
                "start the extender with node-cache-capable: false",
            )

    def _take(self, count: int, held: list[int]) -> None:
        if not self.budget.take(count):
            raise _Refusal(
                503,
                "busy",
                f"{self.budget.held_bytes} bytes of request bodies in flight; {count} more "
                f"would pass max-inflight-body-bytes ({self.budget.limit_bytes}); retry later",
            )
        held[0] += count

    def _refuse(self, request: web.Request, refusal: _Refusal) -> web.Response:
        self.refused.labels(refusal.reason).inc()
        log.warning("%s %s refused (%d): %s", request.method, request.path, refusal.status, refusal)
        response = web.Response(
            status=refusal.status,
            text=json.dumps({"Error": str(refusal)}),
            content_type="application/json",
            headers={"Retry-After": "1"} if refusal.status == 503 else None,
        )
        response.force_close()  # the rest of the body is never read
        return response
