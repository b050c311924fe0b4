"""The one HTTP serving foundation under every listener kubegpu has: the extender's verbs and
metrics, the peer webhook, the exporter's ``/metrics`` and the node agent's and DRA driver's
probes (:mod:`kubegpu.probes`). Each listener is an aiohttp application served here under
:class:`HttpLimits`; what the defences are, and why:

* **A whole request head within** ``head_timeout_s`` of the connection opening (or of its last
  answer), the TLS handshake included. A client that dribbles its head a byte at a time is
  closed at that deadline, however busy it looks.
* **A whole body within** ``body_timeout_s`` of its head, at most ``max_body_bytes`` of it, and
  at most ``max_inflight_body_bytes`` held by all requests at once. The size limit is checked
  against the running total, so a missing, negative or false ``Content-Length`` cannot get
  round it; over it is 413, a full budget 503 (retry later), a late body 408. The body is read
  before the handler runs, so no handler ever waits on a client.
* **At most** ``max_connections`` **connections, and at most** ``max_connections_per_client``
  **from one address.** Past either the new connection is closed on arrival. The per-client
  cap is what keeps a listener answering others while one client holds every slot it may: a
  pod flooding the node agent's health port with half-open heads cannot starve the kubelet's
  probes (they come from another address).
* **JSON no deeper than** ``max_json_depth`` and never a 500 for input: :func:`json_body` turns
  malformed, too deep or wrongly typed JSON into a 400 naming what is wrong
  (:class:`BadRequest`), and a handler's own bug is a 500 without a traceback sent back.

Served either on the caller's event loop (:class:`HttpListener`, the extender) or on a loop of
its own in a daemon thread (:class:`HttpThread`): the node agent's liveness check must still
answer, with 503 and why, when the agent's loop is stuck, and the exporter and the webhook have
no loop at all.

It belongs to no edge (aiohttp and the standard library only): the exporter, the kubelet and
DRA edges, the webhook and the extender all serve HTTP, and none may import another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import ssl
import sys
import threading
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

BODY_KEY = web.RequestKey("kubegpu_body", bytes)


@dataclass(frozen=True)
class HttpLimits:
    """What one listener allows a client (see the module for why each exists)."""

    # A scrape, probe or review sends its whole head at once; one that has not within this
    # long is broken or hostile.
    head_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    max_body_bytes: int = 64 * 1024
    max_inflight_body_bytes: int = 16 * 1024 * 1024
    max_connections: int = 64
    max_connections_per_client: int = 16
    # Kubernetes objects nest about 15 levels (an AdmissionReview 17); far more is an attack,
    # and code that walks the decoded value recursively must not meet Python's limit.
    max_json_depth: int = 64

    def __post_init__(self) -> None:
        for name in ("head_timeout_s", "body_timeout_s"):
            if not 0 < getattr(self, name) <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds, got {getattr(self, name)}")
        for name in (
            "max_body_bytes",
            "max_inflight_body_bytes",
            "max_connections",
            "max_connections_per_client",
            "max_json_depth",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class Refusals(Protocol):
    """Where a listener counts what it refused (a labelled prometheus Counter fits): reasons
    ``too-large`` (413), ``busy`` (503), ``timeout`` (408), ``bad-request`` (400) and
    ``connections`` (closed on arrival, over a connection cap)."""

    def labels(self, reason: str) -> Any: ...


class BodyBytes(Protocol):
    """A gauge of the body bytes held right now (a prometheus Gauge fits)."""

    def set(self, value: float) -> None: ...


class BadRequest(Exception):
    """The request cannot be answered as sent: a 400 whose body is the message. Raise it from a
    handler or a parser; the foundation renders it."""


ErrorBody = Callable[[int, str], web.Response]


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    """A plain-text answer: ``text`` plus a newline."""
    return web.Response(status=status, text=f"{text}\n", headers=headers)


def text_error(status: int, message: str) -> web.Response:
    return text_response(status, message)


def json_error(status: int, message: str) -> web.Response:
    """An error as kube-scheduler's extender client reads one: ``{"Error": message}``."""
    return web.json_response({"Error": message}, status=status)


# --- JSON -----------------------------------------------------------------------------------

_DECODER = msgspec.json.Decoder()


def decode_json(raw: bytes, *, max_depth: int = HttpLimits.max_json_depth) -> Any:
    """``raw`` decoded, or :class:`BadRequest` naming why not (malformed, not UTF-8, deeper
    than ``max_depth``)."""
    try:
        value = _DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec's word for bad UTF-8 inside a string
        raise BadRequest(f"request body is not JSON: not UTF-8 ({exc.reason})") from None
    except RecursionError:
        raise BadRequest(f"request body is JSON nested deeper than {max_depth} levels") from None
    check_depth(value, max_depth)
    return value


def check_depth(value: Any, max_depth: int) -> None:
    """Raise :class:`BadRequest` when ``value`` nests lists and objects deeper than
    ``max_depth``. Iterative: the point is not to meet the recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    raise BadRequest(f"request body is JSON nested deeper than {max_depth} levels")
                stack.append((child, depth + 1))


async def json_body(request: web.Request) -> Any:
    """The request's body (read by the foundation, within its limits) decoded as JSON."""
    return decode_json(request[BODY_KEY], max_depth=request.app[_LIMITS_KEY].max_json_depth)


# --- request bodies -------------------------------------------------------------------------


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


class _Intake:
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
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while chunk := await request.content.readany():
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


_LIMITS_KEY = web.AppKey("kubegpu_http_limits", HttpLimits)
_INTAKE_KEY = web.AppKey("kubegpu_http_intake", _Intake)


def hardened_app(
    limits: HttpLimits = HttpLimits(),
    *,
    error_body: ErrorBody = text_error,
    refusals: Refusals | None = None,
    body_bytes: BodyBytes | None = None,
    body_hint: str = "",
) -> web.Application:
    """An empty application with the foundation's middlewares; add routes, then serve it with
    :class:`HttpListener` or :class:`HttpThread` under the same ``limits``. ``body_hint``
    ends the 413 message (what to change when a legitimate body is refused)."""
    intake = _Intake(
        limits, error_body=error_body, refusals=refusals, body_bytes=body_bytes, body_hint=body_hint
    )
    # aiohttp's own cap is the last word only if ours were bypassed: ours answers first.
    app = web.Application(
        client_max_size=limits.max_body_bytes + 1, middlewares=[intake.no_crash, intake.bodies]
    )
    app[_LIMITS_KEY] = limits
    app[_INTAKE_KEY] = intake
    return app


# --- connections ----------------------------------------------------------------------------


class _ConnectionGate:
    """Counts open connections, in all and per client address, and says whether one more may
    open. Warnings about refusals are rate-limited: a flood must not become a log flood."""

    WARN_EVERY_S = 10.0

    def __init__(self, limits: HttpLimits, name: str, count: Callable[[str], None]) -> None:
        self.limits = limits
        self.name = name
        self.count = count
        self.open: Tally[str] = Tally()
        self.total = 0
        self._refused_since_warning = 0
        self._warned_at = -self.WARN_EVERY_S

    def admit(self, client: str) -> bool:
        if (
            self.total >= self.limits.max_connections
            or self.open[client] >= self.limits.max_connections_per_client
        ):
            self._refused(client)
            return False
        self.total += 1
        self.open[client] += 1
        return True

    def release(self, client: str) -> None:
        self.total -= 1
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]

    def _refused(self, client: str) -> None:
        self.count("connections")
        self._refused_since_warning += 1
        now = time.monotonic()
        if now - self._warned_at >= self.WARN_EVERY_S:
            log.warning(
                "%s: closed %d new connection(s) on arrival (latest from %s: it has %d open, "
                "%d in all; caps %d per client, %d in all)",
                self.name,
                self._refused_since_warning,
                client,
                self.open[client],
                self.total,
                self.limits.max_connections_per_client,
                self.limits.max_connections,
            )
            self._refused_since_warning = 0
            self._warned_at = now


class _GatedProtocol(asyncio.Protocol):
    """aiohttp's per-connection protocol behind the gate: a connection the gate refuses is
    closed before aiohttp sees it; any other is handed through untouched."""

    def __init__(self, inner: asyncio.Protocol, gate: _ConnectionGate) -> None:
        self._inner = inner
        self._gate = gate
        self._client: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self._gate.admit(client):
            if isinstance(transport, asyncio.Transport):
                transport.abort()
            else:
                transport.close()
            return
        self._client = client
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._client is None:
            return
        self._gate.release(self._client)
        self._client = None
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class _GatedSite(web.BaseSite):
    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        gate: _ConnectionGate,
        limits: HttpLimits,
        ssl_context: ssl.SSLContext | None,
        backlog: int,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._gate = gate
        self._limits = limits

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # set up by the runner before any site starts
        gate = self._gate
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _GatedProtocol(server(), gate),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            # aiohttp's head deadline starts once the handshake is done; this bounds the
            # handshake itself by the same allowance.
            ssl_handshake_timeout=self._limits.head_timeout_s if self._ssl_context else None,
        )


class _ProtocolLog(logging.Logger):
    """aiohttp's connection-level logger: a request it cannot parse (a negative
    ``Content-Length``, a garbled head) is the client's fault, answered 400 by aiohttp itself;
    it logs each with a traceback at ERROR, which turns a hostile client into a log flood.
    Here each is one line at INFO, naming the client."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        kwargs.pop("exc_info", None)
        error = sys.exc_info()[1]
        self.info(f"{msg}: {error}".replace("\n", " ") if error else msg, *args, **kwargs)


_PROTOCOL_LOG = _ProtocolLog(__name__ + ".protocol")
_PROTOCOL_LOG.parent = log


class HttpListener:
    """``app`` (from :func:`hardened_app`) served on ``host:port`` on the running event loop.
    :meth:`start` binds (``OSError`` when the address is taken or not ours)."""

    # Grace for requests in flight when the listener stops.
    SHUTDOWN_GRACE_S = 1.0
    # After refusing a request whose body it did not read, aiohttp reads and drops the rest
    # this long before closing: long enough for the client to read the answer rather than
    # meet a reset, no longer (aiohttp's default is 10 s).
    LINGER_S = 2.0

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        name: str,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.name = name
        self.limits = app[_LIMITS_KEY]
        self._ssl_context = ssl_context
        self._backlog = backlog
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            # aiohttp closes a connection still waiting for a whole head this long after it
            # opened or was last answered (its default is an hour).
            keepalive_timeout=self.limits.head_timeout_s,
            lingering_time=self.LINGER_S,
            logger=_PROTOCOL_LOG,
            shutdown_timeout=self.SHUTDOWN_GRACE_S,
        )
        await runner.setup()
        intake = self.app[_INTAKE_KEY]
        site = _GatedSite(
            runner,
            self.host,
            self.port,
            gate=_ConnectionGate(self.limits, self.name, intake.count),
            limits=self.limits,
            ssl_context=self._ssl_context,
            backlog=self._backlog,
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            if exc.errno is None:
                raise
            # asyncio rewords it ("error while attempting to bind on address ..."); callers
            # name the address themselves and want the plain reason.
            raise OSError(exc.errno, os.strerror(exc.errno)) from None
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


class HttpThread:
    """``app`` (from :func:`hardened_app`) served on ``host:port`` by a loop of its own in a
    daemon thread, started at once. Binding happens in the constructor, so a taken port raises
    ``OSError`` there. :meth:`stop` stops it."""

    def __init__(
        self,
        host: str,
        port: int,
        app: web.Application,
        *,
        name: str,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._listener = HttpListener(app, host, port, name=name, ssl_context=ssl_context)
        self._loop = asyncio.new_event_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.result()

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._listener.start())
        except BaseException as exc:
            loop.close()
            started.set_exception(exc)
            return
        started.set_result(None)
        try:
            loop.run_forever()
            loop.run_until_complete(self._listener.stop())
        finally:
            loop.close()

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def url(self) -> str:
        return self._listener.url

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, give requests in flight a moment, close. Safe to call twice and from
        any thread but the server's own."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
