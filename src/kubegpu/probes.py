"""``/healthz`` and ``/readyz`` for the kubelet's probes, answered by a role's event loop: the
node agent's (:mod:`kubegpu.kubelet.probes`) and the DRA driver's (:mod:`kubegpu.dra.probes`).

It belongs to no edge (like :mod:`kubegpu.httpd`, which serves it): both roles' edges describe
their state as a :class:`ProbeTarget`, and neither may import the other.

Each request hands one check to the role's event loop and waits a bounded time for its answer:
a check in a thread of its own would keep answering while the loop hung, and asking the loop is
the point of the liveness check. A stuck loop is a 503 saying so, a failing check one naming
why. Bodies are one line of text: ``ok: …`` or the reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from kubegpu.httpd import HttpLimits, HttpThread, hardened_app, text_response

log = logging.getLogger(__name__)

# How long a probe waits for the loop (and the checks it runs there); the probes' timeoutSeconds
# in the DaemonSets must be longer, or the kubelet gives up before we can say why.
LOOP_TIMEOUT_S = 3.0
# How long a liveness check waits for each gRPC ping of a role's own servers: under
# LOOP_TIMEOUT_S, so a dead server is reported as such rather than as an unresponsive loop.
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


# A probe is a GET with no body; the kubelet sends it from the node's address, one connection
# each. The per-client cap is what keeps those answered while a pod floods the port.
PROBE_LIMITS = HttpLimits(max_body_bytes=1024, max_inflight_body_bytes=64 * 1024)


async def ask_loop(
    loop: asyncio.AbstractEventLoop,
    check: Callable[[], Coroutine[Any, Any, ProbeResult]],
    timeout_s: float,
) -> ProbeResult:
    """Run ``check`` on ``loop`` (the role's, not the caller's) and wait at most
    ``timeout_s`` for its answer."""
    coro = check()
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # the loop is closed: the role is on its way out
        coro.close()
        return ProbeResult(False, "stopping: the event loop has closed")
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except TimeoutError:
        future.cancel()
        return ProbeResult(False, f"event loop unresponsive: no answer within {timeout_s:.1f}s")
    except (asyncio.CancelledError, concurrent.futures.CancelledError):
        if future.cancelled():
            return ProbeResult(False, "stopping: the check was cancelled")
        raise  # the probe request itself was cancelled (its client went away)
    except Exception as err:  # a bug in a check must read as unhealthy, not as a 500
        return ProbeResult(False, f"check failed: {type(err).__name__}: {err}")


def make_probe_app(
    target: ProbeTarget,
    loop: asyncio.AbstractEventLoop,
    loop_timeout_s: float = LOOP_TIMEOUT_S,
    *,
    role: str = "kubegpu node agent",
    limits: HttpLimits = PROBE_LIMITS,
) -> web.Application:
    checks = {"/healthz": target.liveness, "/readyz": target.readiness}

    async def probe(request: web.Request) -> web.Response:
        check = checks.get(request.path)
        if check is None:
            return text_response(404, f"{role}: see /healthz and /readyz")
        result = await ask_loop(loop, check, loop_timeout_s)
        return text_response(200 if result.ok else 503, result.reason)

    app = hardened_app(limits)
    app.router.add_route("*", "/{path:.*}", probe)
    return app


def start_probe_server(
    address: tuple[str, int],
    target: ProbeTarget,
    loop: asyncio.AbstractEventLoop,
    *,
    node: str = "-",
    loop_timeout_s: float = LOOP_TIMEOUT_S,
    role: str = "kubegpu node agent",
    thread_name: str = "kubegpu-agent-probes",
    limits: HttpLimits = PROBE_LIMITS,
) -> HttpThread:
    """Serve ``/healthz`` and ``/readyz`` for ``target`` on ``address`` (port 0: any free).
    Raises :class:`ProbeServerError` when the address cannot be served."""
    host, port = address
    try:
        server = HttpThread(
            host,
            port,
            make_probe_app(target, loop, loop_timeout_s, role=role, limits=limits),
            name=thread_name,
        )
    except OSError as err:
        raise ProbeServerError(
            f"cannot serve /healthz and /readyz on {host}:{port}: {err.strerror or err}"
        ) from err
    log.info("node %s: health endpoints on %s/healthz and %s/readyz", node, server.url, server.url)
    return server
