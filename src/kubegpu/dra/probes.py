"""The DRA driver's ``/healthz`` and ``/readyz``, for the kubelet's liveness and readiness probes.

The endpoints are :mod:`kubegpu.probes`, the node agent's too: each request runs one check of
:class:`DriverProbes` on the driver's event loop and waits a bounded time for its answer.
:func:`~kubegpu.dra.server.serve_dra_driver` tells the object what happened; it answers:

* ``/healthz`` (liveness): 200 when the loop ran the check and both kubelet-plugin gRPC servers
  answer on their sockets, the registration one ``GetInfo`` (the plugin watcher's first call)
  and the DRA one an empty ``NodePrepareResources`` (the kubelet's call, with nothing to
  prepare: no effect). A stuck loop, a dead server or a deleted socket is a 503 naming which;
  after the probe's failure threshold the kubelet restarts the container, which re-creates both
  sockets (a deleted registration socket is never registered again otherwise).
* ``/readyz`` (readiness): 200 once the kubelet has registered the driver (its plugin watcher
  called ``NotifyRegistrationStatus`` with ``plugin_registered=true``) and the node's
  ResourceSlices have been published at least once; 503 with the one-line reason otherwise.
  A kubelet that restarts is not noticed here until it registers the driver again (it does by
  itself: the registration socket stays), so the pod stays Ready meanwhile.

While another driver serves the kubelet folder (a rolling update's overlap) this one waits:
``/healthz`` 200 and ``/readyz`` 503, both ``waiting: <socket> is served by another DRA driver
(<owner>)``, so it is neither restarted nor counted ready until it has taken over.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from kubegpu.dra.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.dra.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.dra.api.pluginregistration.v1 import api_pb2 as reg_pb
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.probes import PING_TIMEOUT_S, ProbeResult
from kubegpu.unix_channels import unix_aio_channel


async def _ping(socket_path: Path, registration: bool, timeout_s: float) -> str | None:
    """One call on ``socket_path``: None when it answers, else why not."""
    try:
        async with unix_aio_channel(socket_path) as channel:
            if registration:
                await reg_grpc.RegistrationStub(channel).GetInfo(
                    reg_pb.InfoRequest(), timeout=timeout_s
                )
            else:
                await dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_v1.NodePrepareResourcesRequest(), timeout=timeout_s
                )
    except grpc.aio.AioRpcError as err:
        details = (err.details() or "").splitlines()
        return f"{err.code().name}: {details[0] if details else 'no details'}"
    return None


class DriverProbes:
    """What the DRA driver's probes answer, from what the driver reports as it runs."""

    def __init__(self, node: str, driver: str, ping_timeout_s: float = PING_TIMEOUT_S) -> None:
        self.node = node
        self.driver = driver
        self.ping_timeout_s = ping_timeout_s
        self._sockets: tuple[Path, Path] | None = None  # (registration, DRA) while served
        self._stopped = False
        self._generation: int | None = None  # of the last ResourceSlices published
        self._registered = False
        self._refused: str | None = None
        self._waiting: str | None = None  # why it serves nothing yet: another driver does

    # -- what the driver reports -----------------------------------------------------------------

    def published(self, generation: int) -> None:
        """The node's ResourceSlices are written, at ``generation``."""
        self._generation = generation

    def waiting(self, why: str | None) -> None:
        """Another driver serves this kubelet folder and this one waits for it to exit (None:
        it has exited, and this one is starting)."""
        self._waiting = why

    def serving(self, registration: Path, dra: Path) -> None:
        """Both gRPC servers are started on these sockets."""
        self._sockets = (registration, dra)
        self._waiting = None

    def registration_status(self, registered: bool, error: str) -> None:
        """The kubelet's ``NotifyRegistrationStatus``."""
        self._registered = registered
        self._refused = None if registered else (error or "no reason given")

    def stopped(self) -> None:
        """Both servers are stopped and their sockets removed."""
        self._sockets = None
        self._stopped = True

    # -- the probes' checks (on the driver's loop) ------------------------------------------------

    async def liveness(self) -> ProbeResult:
        if self._waiting is not None:
            # Alive and doing what it should (a rolling update's overlap): not restarted.
            return ProbeResult(True, f"waiting: {self._waiting}")
        if self._sockets is None:
            return ProbeResult(False, self._not_serving())
        registration, dra = self._sockets
        errors = await asyncio.gather(
            _ping(registration, True, self.ping_timeout_s),
            _ping(dra, False, self.ping_timeout_s),
        )
        failures = [
            f"{what} socket {path}: {error}"
            for what, path, error in zip(
                ("registration", "DRA"), (registration, dra), errors, strict=True
            )
            if error is not None
        ]
        if failures:
            return ProbeResult(False, f"gRPC server not answering: {'; '.join(failures)}")
        return ProbeResult(True, f"ok: serving {self.driver} on {registration} and {dra}")

    async def readiness(self) -> ProbeResult:
        if self._refused is not None:
            return ProbeResult(
                False, f"not registered: the kubelet refused {self.driver}: {self._refused}"
            )
        if self._waiting is not None:
            return ProbeResult(False, f"waiting: {self._waiting}")
        if self._sockets is None:
            return ProbeResult(False, self._not_serving())
        if self._generation is None:
            return ProbeResult(
                False, f"not ready: the ResourceSlices of node {self.node} are not published yet"
            )
        if not self._registered:
            return ProbeResult(
                False,
                f"not registered: the kubelet's plugin watcher has not registered {self.driver} "
                f"yet (no NotifyRegistrationStatus on {self._sockets[0]})",
            )
        return ProbeResult(
            True,
            f"ok: {self.driver} registered with the kubelet, ResourceSlices of node {self.node} "
            f"published (generation {self._generation})",
        )

    def _not_serving(self) -> str:
        if self._stopped:
            return "stopping: the kubelet-plugin sockets are removed"
        return "starting: the kubelet-plugin sockets are not served yet"
