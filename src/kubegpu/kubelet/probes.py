"""The node agent's ``/healthz`` and ``/readyz``, for the kubelet's liveness and readiness probes.

The endpoints themselves are :mod:`kubegpu.probes` (served by :mod:`kubegpu.httpd`, shared with
the DRA driver); each request hands one check to the agent's event loop and waits a bounded time
for its answer. What the checks are (:class:`~kubegpu.kubelet.plugin_set.PluginSet`):

* ``/healthz`` (liveness) answers 200 when the loop ran the check within ``LOOP_TIMEOUT_S``
  and every resource's gRPC server answered ``GetDevicePluginOptions`` on its socket, the
  first call the kubelet makes. A stuck loop or a dead server is a 503 naming which, and after
  the probe's failure threshold the kubelet restarts the container.
* ``/readyz`` (readiness) answers 200 when every resource is registered with the kubelet that
  runs now (a restarted kubelet has a new ``kubelet.sock``; we are ready again once we have
  registered with it), and 503 with the missing resources otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.probes import PING_TIMEOUT_S, ProbeResult
from kubegpu.unix_channels import unix_aio_channel


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
