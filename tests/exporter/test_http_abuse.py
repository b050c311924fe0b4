"""The small threaded HTTP server behind the exporter's /metrics and the node agent's probes,
over real sockets, against clients that never finish their request: each connection is dropped
once its head is overdue, connections past the cap are closed at once (no thread each), and
whole requests are served again afterwards. Every wait is a generous upper bound."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.httpd import HttpThread, text_reply


def hello(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    return text_reply(start_response, 200, "ok")


@pytest.fixture
def server() -> Iterator[HttpThread]:
    thread = HttpThread(
        "127.0.0.1", 0, hello, name="test-http", head_timeout_s=0.5, max_connections=8
    )
    yield thread
    thread.stop()


def half_sent(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=20)
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAcc")
    return conn


def closed(conn: socket.socket) -> bool:
    """Whether the server closed it (reads until EOF; a reset counts as closed)."""
    try:
        while conn.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_connections_that_never_finish_their_head_are_dropped_and_capped(
    server: HttpThread,
) -> None:
    connections = [half_sent(server.port) for _ in range(20)]
    try:
        assert all(closed(c) for c in connections)
        with urllib.request.urlopen(f"{server.url}/", timeout=10) as response:
            assert response.read() == b"ok\n"
    finally:
        for c in connections:
            c.close()


def test_a_client_that_dribbles_its_head_is_dropped_at_the_deadline(server: HttpThread) -> None:
    conn = half_sent(server.port)
    conn.settimeout(0.2)
    try:
        for _ in range(100):  # a byte every 0.2 s: each read is quick, the head never ends
            try:
                conn.sendall(b"x")
            except OSError:
                break
            try:
                if conn.recv(4096) == b"":
                    break
            except TimeoutError:
                continue
        else:
            pytest.fail("the server kept a dribbling client for 20 s")
    finally:
        conn.close()
