"""A small WSGI app served from a daemon thread: the exporter's ``/metrics`` and ``/healthz``
and the node agent's and the DRA driver's ``/healthz`` and ``/readyz`` (:mod:`kubegpu.probes`)
all run on it.

It belongs to no edge (standard library only, like :mod:`kubegpu.tls`): the exporter and the
kubelet edge both serve HTTP, and neither may import the other.

Threads, not the asyncio loop, on purpose: the node agent's liveness check must still answer
(with 503 and why) when its event loop is stuck, and the exporter has no loop at all. The
standard library's ``wsgiref`` is enough for a scrape every few seconds and a probe every few
more, and keeps the node agent's start-up free of any web framework. Its one weakness, a thread
per connection with no deadline, is bounded here: a request head must arrive within
``head_timeout_s`` and at most ``max_connections`` are served at once.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


# A scrape or probe sends its whole request head at once; a client that has not within this
# long is broken or hostile, and holds a thread until dropped.
HEAD_TIMEOUT_S = 10.0
# Connections served at once (a thread each); more are closed on arrival, so clients that
# never finish cannot pile up threads and file descriptors without bound.
MAX_CONNECTIONS = 64


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client must not keep the process alive
    head_timeout_s = HEAD_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(self.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning(
                "http: %d connections open already; closing one from %s",
                self.max_connections,
                client_address[0] if client_address else "?",
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that fails the TLS handshake or hangs up is its own problem, not a traceback.
        if isinstance(sys.exc_info()[1], ssl.SSLError | ConnectionError | TimeoutError):
            log.debug("http: connection from %s failed", client_address, exc_info=True)
            return
        super().handle_error(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _QuietHandler(WSGIRequestHandler):
    server: _ThreadingServer

    def setup(self) -> None:
        # Each read gives up after the head's whole allowance; the timer below bounds the sum,
        # so a client dribbling a byte at a time is dropped too.
        super().setup()
        self.connection.settimeout(self.server.head_timeout_s)
        self._overdue = threading.Timer(self.server.head_timeout_s, self._drop)
        self._overdue.daemon = True
        self._overdue.start()

    def _drop(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers too
        self._overdue.cancel()  # the head is in; the app's answer is not bounded here
        return parsed

    def finish(self) -> None:
        self._overdue.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        # Probes and scrapes arrive every few seconds: an access log would drown the real ones.
        log.debug("http: " + format, *args)


def text_reply(start_response: StartResponse, status: int, text: str) -> list[bytes]:
    """A plain-text answer: ``text`` plus a newline, with the status's standard phrase."""
    phrase = HTTPStatus(status).phrase
    start_response(f"{status} {phrase}", [("Content-Type", "text/plain; charset=utf-8")])
    return [f"{text}\n".encode()]


class HttpThread:
    """``app`` served on ``host:port`` from a daemon thread, started at once; :meth:`stop`
    stops it. Binding happens in the constructor, so a taken port raises ``OSError`` there."""

    def __init__(
        self,
        host: str,
        port: int,
        app: WsgiApp,
        *,
        name: str,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        server_class: type[_ThreadingServer] = type(
            "_Server",
            (_ThreadingServer,),
            {"head_timeout_s": head_timeout_s, "max_connections": max_connections},
        )
        self._server = make_server(
            host, port, app, server_class=server_class, handler_class=_QuietHandler
        )
        self._scheme = "http"
        if ssl_context is not None:
            # The handshake happens on the connection's first read, in its own thread and
            # under the head timeout, so a client that never completes it blocks nobody.
            self._server.socket = ssl_context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
            self._scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        host = host.decode() if isinstance(host, bytes) else host
        return f"{self._scheme}://{host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting and close the socket (blocks up to half a second: call it off any
        event loop). Requests being answered finish on their own daemon threads."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)
