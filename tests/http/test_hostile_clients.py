"""Every HTTP listener (tests/http/surfaces.py) against the clients that broke them: heads and
bodies that never finish, a Content-Length that is negative or missing, JSON nested past any
sense or with a field of the wrong type, and one address flooding the port with connections.
Over real sockets; the hostile client speaks from 127.0.0.2, the well-behaved one from
127.0.0.1, as a pod and the kubelet would from their own addresses. Waits are generous upper
bounds, never timings asserted."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.http.surfaces import (
    SURFACES,
    Surface,
    exporter_surface,
    extender_surfaces,
    probe_surface,
    webhook_surface,
)
from tests.json_mutants import paths, replaced

WELL_BEHAVED = "127.0.0.1"
HOSTILE = "127.0.0.2"
SLACK_S = 5.0  # on top of a deadline, for a loaded machine


@pytest.fixture(scope="module")
def listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Surface]]:
    proc = Path(tmp_path_factory.mktemp("proc"))
    with contextlib.ExitStack() as stack:
        found: dict[str, Surface] = {}
        for started in (
            extender_surfaces(),
            webhook_surface(),
            probe_surface(),
            exporter_surface(proc),
        ):
            found.update((s.name, s) for s in stack.enter_context(started))
        assert set(found) == set(SURFACES)
        yield found


@pytest.fixture(params=SURFACES)
def surface(request: pytest.FixtureRequest, listeners: dict[str, Surface]) -> Surface:
    return listeners[request.param]


def posts(listeners_: tuple[str, ...] = SURFACES) -> list[tuple[str, str]]:
    """(surface, path) of every JSON POST route; known without starting anything."""
    routes = {
        "extender": ("/filter", "/prioritize", "/prioritize-dra", "/bind"),
        "peer-webhook": ("/mutate",),
    }
    return [(name, path) for name in listeners_ for path in routes.get(name, ())]


def connect(port: int, source: str = HOSTILE, timeout_s: float = 20.0) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0)
    )


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    source: str = WELL_BEHAVED,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def closed(conn: socket.socket) -> bytes:
    """All the server sent before it closed ``conn`` (fails if it never does in time)."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := conn.recv(65536):
            received += chunk
    return received


def status_of(raw: bytes) -> int | None:
    return int(raw.split(b" ", 2)[1]) if raw.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")) else None


def test_every_listener_answers_its_own_request(surface: Surface) -> None:
    status, _ = request(surface.port, "GET", surface.probe_path)
    assert surface.status_ok(status)


def test_a_head_dribbled_a_byte_at_a_time_is_closed_at_its_deadline(surface: Surface) -> None:
    conn = connect(surface.port, timeout_s=0.1)
    started = time.monotonic()
    conn.sendall(b"GET " + surface.probe_path.encode() + b" HTTP/1.1\r\nHost: x\r\n")
    try:
        while time.monotonic() - started < surface.limits.head_timeout_s + SLACK_S:
            try:
                conn.sendall(b"X")
                if conn.recv(4096) == b"":
                    return  # closed by the server
            except TimeoutError:
                continue
            except OSError:
                return  # reset by the server
        pytest.fail(f"{surface.name} kept a dribbling head past its deadline")
    finally:
        conn.close()


@pytest.mark.parametrize(("name", "path"), posts())
def test_a_body_dribbled_a_byte_at_a_time_is_refused_at_its_deadline(
    listeners: dict[str, Surface], name: str, path: str
) -> None:
    """Each byte arrives well inside any per-read timeout; the whole body never does."""
    surface = listeners[name]
    conn = connect(surface.port, timeout_s=0.2)
    started = time.monotonic()
    received = b""
    try:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100000\r\n\r\n{{".encode()
        )
        while time.monotonic() - started < surface.limits.body_timeout_s + SLACK_S:
            try:
                conn.sendall(b" ")
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail(f"{surface.name} kept a dribbled body past its deadline")
    finally:
        conn.close()
    assert status_of(received) == 408, received[:200]


@pytest.mark.parametrize(("name", "path"), posts())
@pytest.mark.parametrize("length", ["-1", "-4096", "+5", "0x10", "1, 2", None])
def test_a_false_or_missing_length_cannot_get_a_body_past_the_cap(
    listeners: dict[str, Surface], name: str, path: str, length: str | None
) -> None:
    surface = listeners[name]
    body = b"[" + b"0," * surface.limits.max_body_bytes + b"0]"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if length is None:
        head += "Transfer-Encoding: chunked\r\n\r\n"
        payload = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    else:
        head += f"Content-Length: {length}\r\n\r\n"
        payload = body
    conn = connect(surface.port)
    try:
        conn.sendall(head.encode())
        with contextlib.suppress(OSError):  # the server may close before all is sent
            conn.sendall(payload)
        assert status_of(closed(conn)) in {400, 413}
    finally:
        conn.close()
    status, _ = request(surface.port, "GET", "/healthz" if name != "extender" else "/readyz")
    assert status < 500


@pytest.mark.parametrize(("name", "path"), posts())
@pytest.mark.parametrize("depth", [100, 100_000])
def test_json_nested_past_the_limit_is_a_400(
    listeners: dict[str, Surface], name: str, path: str, depth: int
) -> None:
    surface = listeners[name]
    valid = surface.json_posts[path]
    deep = b"[" * depth + b"]" * depth
    bodies = [deep, json.dumps({**valid, "deep": None}).encode().replace(b"null", deep)]
    # And inside the object the handler reads (the pod, the review's request), where a
    # depth the decoder allows would otherwise be accepted.
    inner = next((k for k, v in valid.items() if isinstance(v, dict)), None)
    if inner is not None:
        nested = {**valid, inner: {**valid[inner], "deep": None}}
        bodies.append(json.dumps(nested).encode().replace(b"null", deep))
    for body in bodies:
        status, answer = request(
            surface.port, "POST", path, body, {"Content-Type": "application/json"}
        )
        assert status == 400, (body[:80], answer[:300])


WRONG_TYPES: tuple[Any, ...] = ("text", 7, -1.5, True, None, [], ["x"], {}, {"k": "v"})


@pytest.mark.parametrize(("name", "path"), posts())
def test_a_field_of_any_wrong_type_is_never_a_500(
    listeners: dict[str, Surface], name: str, path: str
) -> None:
    surface = listeners[name]
    valid = surface.json_posts[path]
    failures = []
    cases = [(p, new) for p in paths(valid) for new in WRONG_TYPES]
    cases += [((), new) for new in WRONG_TYPES]  # the whole body
    conn = http.client.HTTPConnection("127.0.0.1", surface.port, timeout=20)
    try:
        for field_path, new in cases:
            body = new if field_path == () else replaced(valid, field_path, new)
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = response.read()
            if response.status >= 500:
                failures.append(f"{'/'.join(map(str, field_path))} = {new!r}: {answer[:200]!r}")
            if response.will_close:
                conn.close()
    finally:
        conn.close()
    assert not failures, f"{len(failures)} of {len(cases)} answered 5xx:\n" + "\n".join(
        failures[:20]
    )


# The extender's verbs listener has no per-client cap below its total, on purpose: its one
# client, kube-scheduler, opens a connection per bind in a burst (httpd and extender/server.py
# say why and what protects it instead).
PER_CLIENT_CAPPED = tuple(name for name in SURFACES if name != "extender")


class HalfOpenFlood:
    """``count`` connections from one address, each sending half a request head and nothing
    more; a connection the server closes is opened again at once. Runs in a thread."""

    def __init__(self, port: int, count: int, source: str = HOSTILE) -> None:
        self.port = port
        self.count = count
        self.source = source
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HalfOpenFlood:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _open(self) -> socket.socket | None:
        try:
            conn = connect(self.port, self.source, timeout_s=2.0)
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            return None
        conn.setblocking(False)
        self.opened += 1
        return conn

    @staticmethod
    def _still_open(conn: socket.socket) -> bool:
        try:
            return conn.recv(1) != b""
        except BlockingIOError:
            return True  # still open, still waiting
        except OSError:
            return False

    def _run(self) -> None:
        held: list[socket.socket | None] = [None] * self.count
        while not self._stop.is_set():
            for i, conn in enumerate(held):
                if conn is not None and not self._still_open(conn):
                    conn.close()
                    conn = None
                held[i] = conn or self._open()
            time.sleep(0.01)
        for conn in held:
            if conn is not None:
                conn.close()


@pytest.mark.parametrize("name", PER_CLIENT_CAPPED)
def test_one_address_flooding_the_port_cannot_starve_another(
    listeners: dict[str, Surface], name: str
) -> None:
    """The hostile address keeps more half-open heads than the listener's whole cap, opening
    each again as it is dropped, while the well-behaved one asks 20 times: every answer
    arrives (before the per-client cap, none did once the flood held every slot)."""
    surface = listeners[name]
    assert surface.limits.max_connections_per_client < surface.limits.max_connections
    with HalfOpenFlood(surface.port, surface.limits.max_connections + 8) as flood:
        deadline = time.monotonic() + 20
        while flood.opened < flood.count and time.monotonic() < deadline:
            time.sleep(0.05)  # until the flood has made every connection once
        time.sleep(0.2)
        answers = [request(surface.port, "GET", surface.probe_path)[0] for _ in range(20)]
    assert all(surface.status_ok(s) for s in answers), answers
    assert flood.opened > surface.limits.max_connections_per_client


def test_connections_past_the_total_cap_are_closed_on_arrival(surface: Surface) -> None:
    # From many addresses, so no per-client cap is met first.
    sources = [f"127.0.1.{i}" for i in range(1, 255)]
    held = []
    try:
        for i in range(surface.limits.max_connections):
            conn = connect(surface.port, source=sources[i % len(sources)], timeout_s=2)
            conn.sendall(b"GET / HTTP/1.1\r\n")
            held.append(conn)
        time.sleep(0.2)  # the server has accepted them all
        extra = connect(surface.port, source="127.0.2.1", timeout_s=2)
        try:
            assert closed(extra) == b""  # closed without a word, before any head
        finally:
            extra.close()
    finally:
        for conn in held:
            conn.close()
    # Once the holders are gone, it serves again.
    deadline = time.monotonic() + SLACK_S
    while True:
        try:
            status, _ = request(surface.port, "GET", surface.probe_path)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert surface.status_ok(status)
