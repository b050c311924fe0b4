"""Serving a :func:`~kubegpu.httpd.intake.hardened_app`: connections counted and capped in
all and per client address before aiohttp sees them, heads and TLS handshakes under a
deadline, on the caller's loop (:class:`HttpListener`) or a loop of its own in a thread
(:class:`HttpThread`)."""

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
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kubegpu.httpd.intake import INTAKE_KEY
from kubegpu.httpd.limits import LIMITS_KEY, HttpLimits

log = logging.getLogger("kubegpu.httpd")


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


_PROTOCOL_LOG = _ProtocolLog("kubegpu.httpd.protocol")
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
        self.limits = app[LIMITS_KEY]
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
        intake = self.app[INTAKE_KEY]
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
