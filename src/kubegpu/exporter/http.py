"""A small WSGI app served from a daemon thread: the exporter's ``/metrics`` and ``/healthz``
and the node agent's ``/healthz`` and ``/readyz`` both run on it.

Threads, not the asyncio loop, on purpose: the node agent's liveness check must still answer
(with 503 and why) when its event loop is stuck, and the exporter has no loop at all. The
standard library's ``wsgiref`` is enough for a scrape every few seconds and a probe every few
more, and keeps the node agent's start-up free of any web framework.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow client must not keep the process alive


class _QuietHandler(WSGIRequestHandler):
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

    def __init__(self, host: str, port: int, app: WsgiApp, *, name: str) -> None:
        self._server = make_server(
            host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting and close the socket (blocks up to half a second: call it off any
        event loop). Requests being answered finish on their own daemon threads."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_s)
