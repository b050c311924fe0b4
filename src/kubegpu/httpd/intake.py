"""Request bodies read whole before a handler runs, under the listener's limits, and no
exception ever reaching a client as a traceback: the middlewares of :func:`hardened_app`.

Moved here from the extender, whose defences they were first: a client that announces a large
body and sends it slowly (or never) held a handler and the bytes it read for as long as it
liked, and sixty such bodies took the process to its memory limit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware

from kubegpu.httpd.limits import (
    BODY_KEY,
    DEFAULT_LIMITS,
    LIMITS_KEY,
    BadRequest,
    BodyBytes,
    ErrorBody,
    Handler,
    HttpLimits,
    Refusals,
    text_error,
)

log = logging.getLogger("kubegpu.httpd")


class BodyBudget:
    """Bytes of request bodies held at once, across every request of a listener."""

    def __init__(self, limit_bytes: int, gauge: BodyBytes | None = None) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._gauge = gauge

    def take(self, count: int) -> bool:
        if self.held_bytes + count > self.limit_bytes:
            return False
        self._set(self.held_bytes + count)
        return True

    def give(self, count: int) -> None:
        self._set(self.held_bytes - count)

    def _set(self, held: int) -> None:
        self.held_bytes = held
        if self._gauge is not None:
            self._gauge.set(held)


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class Intake:
    """The middlewares every listener runs: bodies read under the limits, and no exception
    ever reaching the client as a traceback."""

    def __init__(
        self,
        limits: HttpLimits,
        *,
        error_body: ErrorBody,
        refusals: Refusals | None,
        body_bytes: BodyBytes | None,
        body_hint: str,
    ) -> None:
        self.limits = limits
        self.error_body = error_body
        self.refusals = refusals
        self.budget = BodyBudget(limits.max_inflight_body_bytes, body_bytes)
        self.body_hint = body_hint

    def count(self, reason: str) -> None:
        if self.refusals is not None:
            self.refusals.labels(reason).inc()

    @web.middleware
    async def no_crash(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except BadRequest as exc:
            self.count("bad-request")
            log.info("%s %s from %s: 400: %s", request.method, request.path, request.remote, exc)
            return self.error_body(400, str(exc))
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return self.error_body(500, f"internal error: {type(exc).__name__}")

    @web.middleware
    async def bodies(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.body_exists or request.match_info.http_exception is not None:
            request[BODY_KEY] = b""
            return await handler(request)  # no body (or a 404/405 that never reads it)
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
        if declared is not None and declared >= 0:
            self._check_size(declared)
            self._take(declared, held)
        chunks: list[bytes] = []
        size = 0
        # A body already whole (most are: it came with the head) needs no deadline: setting
        # and cancelling its timer was 1.7 % of the extender's CPU samples at openb (issue 32).
        content = request.content
        deadline = (
            contextlib.nullcontext()
            if content.is_eof()
            else asyncio.timeout(self.limits.body_timeout_s)
        )
        try:
            async with deadline:
                while chunk := await content.readany():
                    size += len(chunk)
                    self._check_size(size)
                    if size > held[0]:  # no (honest) Content-Length: reserve as it arrives
                        self._take(size - held[0], held)
                    chunks.append(chunk)
        except TimeoutError:
            raise _Refusal(
                408,
                "timeout",
                f"request body not complete after {self.limits.body_timeout_s:g} s "
                f"({size} of {declared if declared is not None else 'unknown'} bytes)",
            ) from None
        return b"".join(chunks)

    def _check_size(self, size: int) -> None:
        if size > self.limits.max_body_bytes:
            hint = f"; {self.body_hint}" if self.body_hint else ""
            raise _Refusal(
                413,
                "too-large",
                f"request body of {size} bytes or more is over the limit of "
                f"{self.limits.max_body_bytes} bytes{hint}",
            )

    def _take(self, count: int, held: list[int]) -> None:
        if not self.budget.take(count):
            raise _Refusal(
                503,
                "busy",
                f"{self.budget.held_bytes} bytes of request bodies in flight; {count} more "
                f"would pass the limit of {self.budget.limit_bytes}; retry later",
            )
        held[0] += count

    def _refuse(self, request: web.Request, refusal: _Refusal) -> web.Response:
        self.count(refusal.reason)
        log.warning(
            "%s %s from %s refused (%d): %s",
            request.method,
            request.path,
            request.remote,
            refusal.status,
            refusal,
        )
        response = self.error_body(refusal.status, str(refusal))
        if refusal.status == 503:
            response.headers["Retry-After"] = "1"
        response.force_close()  # the rest of the body is never read
        return response


INTAKE_KEY = web.AppKey("kubegpu_http_intake", Intake)


def hardened_app(
    limits: HttpLimits = DEFAULT_LIMITS,
    *,
    error_body: ErrorBody = text_error,
    refusals: Refusals | None = None,
    body_bytes: BodyBytes | None = None,
    body_hint: str = "",
    outer: Sequence[Middleware] = (),
) -> web.Application:
    """An empty application with the foundation's middlewares; add routes, then serve it with
    :class:`HttpListener` or :class:`HttpThread` under the same ``limits``. ``body_hint``
    ends the 413 message (what to change when a legitimate body is refused); ``outer``
    middlewares run first, around the foundation's, so from before the body is read."""
    intake = Intake(
        limits, error_body=error_body, refusals=refusals, body_bytes=body_bytes, body_hint=body_hint
    )
    # aiohttp's own cap is the last word only if ours were bypassed: ours answers first.
    app = web.Application(
        client_max_size=limits.max_body_bytes + 1,
        middlewares=[*outer, intake.no_crash, intake.bodies],
    )
    app[LIMITS_KEY] = limits
    app[INTAKE_KEY] = intake
    return app
