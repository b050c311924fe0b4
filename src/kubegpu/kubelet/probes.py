"""The node agent's ``/healthz`` and ``/readyz``, for the kubelet's liveness and readiness probes.

The HTTP side is the thread-served WSGI app the exporter uses too (:mod:`kubegpu.httpd`); each
request hands one check to the agent's event loop and waits a bounded time for its answer, so:

* ``/healthz`` (liveness) answers 200 when the loop ran the check within ``loop_timeout_s``
  and every resource's gRPC server answered ``GetDevicePluginOptions`` on its socket, the
  first call the kubelet makes. A stuck loop or a dead server is a 503 naming which, and after
  the probe's failure threshold the kubelet restarts the container.
* ``/readyz`` (readiness) answers 200 when every resource is registered with the kubelet that
  runs now (a restarted kubelet has a new ``kubelet.sock``; we are ready again once we have
  registered with it), and 503 with the missing resources otherwise.

Bodies are one line of text: ``ok: …`` or the reason. A check in a thread of its own would
keep answering while the loop hung; asking the loop is the point of the liveness check.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from kubegpu.httpd import HttpThread, StartResponse, WsgiApp, text_reply
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.kubelet.channels import unix_aio_channel

log = logging.getLogger(__name__)

# How long a probe waits for the loop (and the gRPC pings it makes); the probes' timeoutSeconds
# in the DaemonSet must be longer, or the kubelet gives up before we can say why.
LOOP_TIMEOUT_S = 3.0
PING_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    reason: str  # one line: "ok: …" or what is wrong


class ProbeTarget(Protocol):
    """What the endpoints ask; both run on the target's event loop."""

    async def liveness(self) -> ProbeResult: ...

    async def readiness(self) -> ProbeResult: ...


class ProbeServerError(Exception):
    """The health endpoints cannot be served (the address is taken or not ours)."""


async def ping_device_plugin(socket_path: Path, timeout_s: float = PING_TIMEOUT_S) -> str | None:
    """Call ``GetDevicePluginOptions`` on ``socket_path``: None when it answers, else why not."""
    try:
        async with unix_aio_channel(socket_path) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        details = (err.details() or "").splitlines()
        return f"{err.code().name}: {details[0] if details else 'no details'}"
    return None


async def ping_all(sockets: Iterable[tuple[str, Path]], timeout_s: float = PING_TIMEOUT_S) -> str:
    """Ping every ``(resource, socket)`` at once; "" when all answer, else the failures."""
    pairs = list(sockets)
    errors = await asyncio.gather(*(ping_device_plugin(path, timeout_s) for _, path in pairs))
    return "; ".join(
        f"{resource} on {path}: {error}"
        for (resource, path), error in zip(pairs, errors, strict=True)
        if error is not None
    )


@dataclass(frozen=True)
class IdleTarget:
    """What an agent that idles (``failOnInitError: false``, no usable GPU) answers: alive and
    ready, because there is nothing to do and a never-ready pod would stall every rollout."""

    reason: str

    async def liveness(self) -> ProbeResult:
        return ProbeResult(True, f"ok: idle ({self.reason})")

    async def readiness(self) -> ProbeResult:
        return ProbeResult(True, f"ok: idle, nothing to register ({self.reason})")


def ask_loop(
    loop: asyncio.AbstractEventLoop,
    check: Callable[[], Coroutine[Any, Any, ProbeResult]],
    timeout_s: float,
) -> ProbeResult:
    """Run ``check`` on ``loop`` from another thread and wait at most ``timeout_s``."""
    coro = check()
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed: the agent is on its way out
        coro.close()
        return ProbeResult(False, "stopping: the event loop has closed")
    try:
        return future.result(timeout_s)
    except TimeoutError:
        future.cancel()
        return ProbeResult(False, f"event loop unresponsive: no answer within {timeout_s:.1f}s")
    except concurrent.futures.CancelledError:
        return ProbeResult(False, "stopping: the check was cancelled")
    except Exception as err:  # a bug in a check must read as unhealthy, not as a 500
        return ProbeResult(False, f"check failed: {type(err).__name__}: {err}")


def make_probe_app(
    target: ProbeTarget, loop: asyncio.AbstractEventLoop, loop_timeout_s: float = LOOP_TIMEOUT_S
) -> WsgiApp:
    checks = {"/healthz": target.liveness, "/readyz": target.readiness}

    def app(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        check = checks.get(environ.get("PATH_INFO", "/"))
        if check is None:
            return text_reply(start_response, 404, "kubegpu node agent: see /healthz and /readyz")
        result = ask_loop(loop, check, loop_timeout_s)
        return text_reply(start_response, 200 if result.ok else 503, result.reason)

    return app


def start_probe_server(
    address: tuple[str, int],
    target: ProbeTarget,
    loop: asyncio.AbstractEventLoop,
    *,
    node: str = "-",
    loop_timeout_s: float = LOOP_TIMEOUT_S,
) -> HttpThread:
    """Serve ``/healthz`` and ``/readyz`` for ``target`` on ``address`` (port 0: any free)."""
    host, port = address
    try:
        server = HttpThread(
            host, port, make_probe_app(target, loop, loop_timeout_s), name="kubegpu-agent-probes"
        )
    except OSError as err:
        raise ProbeServerError(
            f"cannot serve /healthz and /readyz on {host}:{port}: {err.strerror or err}"
        ) from err
    log.info("node %s: health endpoints on %s/healthz and %s/readyz", node, server.url, server.url)
    return server
