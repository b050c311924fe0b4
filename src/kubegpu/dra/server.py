"""The DRA kubelet plugin edge: plugin-watcher registration and the DRA gRPC services.

Two sockets, both re-created on start (a stale file from a crashed instance is removed first)
and removed on stop, since deleting the registration socket is how a plugin de-registers. One
driver per kubelet folder: both are served only under the claim of :func:`claim_sockets` (the
node agent's :mod:`kubegpu.socket_claim`), so a second driver waits for the first to exit
instead of replacing its sockets, and a driver stopping removes only the sockets it bound:

* ``<plugins_registry>/<driver>-reg.sock``: ``pluginregistration.Registration``. The kubelet's
  plugin watcher finds it, calls ``GetInfo`` (type ``DRAPlugin``, our driver name, the DRA
  socket, the services we serve, ``v1`` first since the kubelet takes the first it knows) and
  reports the outcome through ``NotifyRegistrationStatus``.
* ``<plugins>/<driver>/dra.sock``: ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``, and
  ``v1alpha1.DRAResourceHealth`` (:mod:`kubegpu.dra.health_stream`). The handlers
  are thin: convert, call :class:`~kubegpu.dra.driver.ClaimPreparer`, convert back. A claim
  that cannot be prepared, for whatever reason, is reported in its own ``error``; the other
  claims of the call are prepared.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from grpc import aio

from kubegpu.core.backend import MigPartitioner
from kubegpu.core.dra import ClaimRef, PreparedClaim
from kubegpu.core.dra_ports import ResourceClaimSource, ResourceSliceSink
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.api.dra.v1 import api_pb2 as dra_v1
from kubegpu.dra.api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from kubegpu.dra.api.dra.v1beta1 import api_pb2 as dra_v1beta1
from kubegpu.dra.api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from kubegpu.dra.api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from kubegpu.dra.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from kubegpu.dra.checkpoint import Checkpoint
from kubegpu.dra.driver import ClaimPreparer, DriverSettings, PrepareError
from kubegpu.dra.health_stream import DeviceHealthServicer
from kubegpu.dra.probes import DriverProbes
from kubegpu.dra.publisher import ResourceSlicePublisher
from kubegpu.dra.registration import RegistrationServicer, RegistrationStatus, SocketPaths
from kubegpu.dra.slices import pool_name
from kubegpu.socket_claim import SocketClaim, SocketInUse, socket_identity

log = logging.getLogger(__name__)


def _claim(message: Any) -> ClaimRef:
    return ClaimRef(namespace=message.namespace, name=message.name, uid=message.uid)


# Longest per-claim error we send; the kubelet puts it in events and the pod's status.
MAX_ERROR_CHARS = 1000


def _status_text(error: Exception) -> str:
    text = str(error)
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


class DraServicer:
    """NodePrepare/NodeUnprepare for one API version (``v1`` or ``v1beta1``: same messages,
    ``v1beta1`` lacks ``Device.share_id``)."""

    def __init__(self, preparer: ClaimPreparer, pb: ModuleType, with_share_id: bool) -> None:
        self.preparer = preparer
        self.pb = pb
        self.with_share_id = with_share_id

    def _devices(self, prepared: PreparedClaim) -> list[Any]:
        devices = []
        for d in prepared.devices:
            fields: dict[str, Any] = {
                "request_names": list(d.request_names),
                "pool_name": d.pool,
                "device_name": d.device,
                "cdi_device_ids": list(d.cdi_device_ids),
            }
            if self.with_share_id and d.share_id is not None:
                fields["share_id"] = d.share_id
            devices.append(self.pb.Device(**fields))
        return devices

    async def NodePrepareResources(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        # The preparer answers every claim, each with its devices or its own error: the
        # kubelet retries the failed ones, the others are prepared.
        outcomes = await self.preparer.prepare([_claim(m) for m in request.claims])
        response = self.pb.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]  # every claim gets an entry, even an empty one
            if isinstance(outcome, PrepareError):
                entry.error = _status_text(outcome)
            else:
                entry.devices.extend(self._devices(outcome))
        return response

    async def NodeUnprepareResources(
        self, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        outcomes = await self.preparer.unprepare([_claim(m) for m in request.claims])
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in outcomes.items():
            entry = response.claims[uid]
            if error is not None:
                entry.error = _status_text(error)
        return response


class _V1Servicer(DraServicer, dra_v1_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer) -> None:
        DraServicer.__init__(self, preparer, dra_v1, with_share_id=True)


class _V1Beta1Servicer(DraServicer, dra_v1beta1_grpc.DRAPluginServicer):
    def __init__(self, preparer: ClaimPreparer) -> None:
        DraServicer.__init__(self, preparer, dra_v1beta1, with_share_id=False)


def _fresh_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)


# What owns a claimed socket, for the message a second driver logs while it waits.
ROLE = "DRA driver"


def claim_sockets(sockets: SocketPaths) -> SocketClaim:
    """The claim on the driver's sockets: an flock on ``<DRA socket>.lock``, in the driver's
    own folder under ``plugins/`` (not in the plugin watcher's folder). One claim covers both
    sockets, since one driver always serves both. Raises SocketInUse naming the owner."""
    return SocketClaim.acquire(sockets.dra, role=ROLE)


class DraPluginServer:
    """Both sockets of the plugin; ``start`` serves the DRA socket before the registration one
    so the kubelet never learns an endpoint that does not answer yet.

    ``claim`` (:func:`claim_sockets`) is held by the caller when given; without one, ``start``
    takes it (raising SocketInUse, touching nothing, while another driver serves) and ``stop``
    gives it back. ``stop`` removes a socket only while it is the one this server bound."""

    def __init__(
        self,
        preparer: ClaimPreparer,
        sockets: SocketPaths,
        on_status: Callable[[RegistrationStatus], None] | None = None,
        health: DeviceHealthServicer | None = None,
        claim: SocketClaim | None = None,
    ) -> None:
        self.preparer = preparer
        self.sockets = sockets
        self.health = health
        self.registration = RegistrationServicer(
            preparer.settings.driver, sockets.dra, on_status=on_status
        )
        self._servers: list[aio.Server] = []
        self.claim = claim
        self._own_claim = False
        self._bound: dict[Path, tuple[int, int] | None] = {}  # socket -> identity we bound

    async def start(self) -> None:
        if self.claim is None:
            self.claim = claim_sockets(self.sockets)
            self._own_claim = True
        try:
            await self._serve()
        except BaseException:
            await self.stop(grace_s=0)  # what did start, and the claim: nothing half-served
            raise

    async def _serve(self) -> None:
        _fresh_socket(self.sockets.dra)
        dra = aio.server()
        dra_v1_grpc.add_DRAPluginServicer_to_server(_V1Servicer(self.preparer), dra)
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(_V1Beta1Servicer(self.preparer), dra)
        if self.health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self.health, dra)
        dra.add_insecure_port(f"unix://{self.sockets.dra}")
        await dra.start()
        self._servers.append(dra)
        self._bound[self.sockets.dra] = socket_identity(self.sockets.dra)

        _fresh_socket(self.sockets.registration)
        reg = aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        reg.add_insecure_port(f"unix://{self.sockets.registration}")
        await reg.start()
        self._servers.append(reg)
        self._bound[self.sockets.registration] = socket_identity(self.sockets.registration)
        log.info(
            "DRA driver %s serving %s, registration at %s",
            self.preparer.settings.driver,
            self.sockets.dra,
            self.sockets.registration,
        )

    async def stop(self, grace_s: float = 5.0) -> None:
        if self.health is not None:
            self.health.close()
        # Registration socket first: the kubelet de-registers before the endpoint goes.
        for server in reversed(self._servers):
            await server.stop(grace_s)
        self._servers.clear()
        for path in (self.sockets.registration, self.sockets.dra):
            # Only a socket this server bound: one refused at start (another driver serves)
            # removes nothing. gRPC itself unlinks whatever socket is at the path when it
            # stops, so the claim, not this check, is what keeps two drivers apart.
            bound = self._bound.pop(path, None)
            if bound is not None and socket_identity(path) == bound:
                path.unlink(missing_ok=True)
        if self._own_claim and self.claim is not None:
            self.claim.release()
            self.claim, self._own_claim = None, False

    async def __aenter__(self) -> DraPluginServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# After a failed republish (API server away), try again this often until one succeeds.
REPUBLISH_RETRY_S = 5.0
# How often a steering driver reads the claims allocated from its pool (dra.steering.intervalS).
DEFAULT_STEER_INTERVAL_S = 5.0


class SlicePublishError(RuntimeError):
    """The node's ResourceSlices could not be published at start (the message says why)."""


async def _wait_any(events: tuple[asyncio.Event, ...], timeout_s: float | None) -> None:
    """Until one of ``events`` is set or ``timeout_s`` passes; no task is left behind."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


# While another driver serves the sockets, look again after this long, doubling up to the
# most: the old pod of a rolling update exits within its grace period, and the new one should
# take over soon after.
CLAIM_RETRY_INITIAL_S = 0.1
CLAIM_RETRY_MAX_S = 2.0


async def wait_for_sockets(
    sockets: SocketPaths,
    stop: asyncio.Event,
    node: str,
    *,
    on_wait: Callable[[str], None] | None = None,
    retry_initial_s: float = CLAIM_RETRY_INITIAL_S,
    retry_max_s: float = CLAIM_RETRY_MAX_S,
) -> SocketClaim | None:
    """The claim on the driver's sockets (:func:`claim_sockets`), waiting while another
    driver serves them (the old pod of a rolling update, a second copy started by hand) and
    saying so once per owner, then ``on_wait(why)``; None when ``stop`` is set first. Meanwhile
    nothing of the owner's is touched: not its sockets, not the checkpoint, not the slices.
    Raises OSError when the lock file cannot be made."""
    delay = retry_initial_s
    waiting: str | None = None
    while not stop.is_set():
        try:
            claim = claim_sockets(sockets)
        except SocketInUse as err:
            if str(err) != waiting:
                waiting = str(err)
                log.warning("node %s: %s; waiting for it to exit", node, err)
                if on_wait is not None:
                    on_wait(waiting)
        else:
            if waiting is not None:
                log.info("node %s: the other DRA driver is gone; serving", node)
            return claim
        await _wait_any((stop,), delay)
        delay = min(delay * 2, retry_max_s)
    return None


async def serve_dra_driver(
    settings: DriverSettings,
    inventory: NodeInventory,
    claims: ResourceClaimSource,
    slices: ResourceSliceSink,
    sockets: SocketPaths,
    stop: asyncio.Event,
    unhealthy: Callable[[], Mapping[str, str]] | None = None,
    started: asyncio.Event | None = None,
    health_changed: asyncio.Event | None = None,
    retry_s: float = REPUBLISH_RETRY_S,
    steer: Callable[[], Awaitable[Sequence[int]]] | None = None,
    steer_interval_s: float = DEFAULT_STEER_INTERVAL_S,
    steer_wake: asyncio.Event | None = None,
    probes: DriverProbes | None = None,
    checkpoint: Checkpoint | None = None,
    claim: SocketClaim | None = None,
    partitioner: MigPartitioner | None = None,
) -> bool:
    """Run the DRA driver of one node until ``stop`` is set: publish the node's ResourceSlices,
    serve the kubelet, republish whenever ``health_changed`` is set (a GPU tainted or
    untainted, as ``unhealthy()`` now says) and whenever the kubelet registers the driver (it
    wipes the node's slices when it starts), then de-register and remove both sockets.

    The first publish failing raises :class:`SlicePublishError` (the role exits and its
    DaemonSet restarts it); a later one is logged and retried every ``retry_s`` until it goes
    through, the kubelet being served meanwhile. A kubelet refusal
    (``NotifyRegistrationStatus(false)``) sets ``stop``: registration is not retried by the
    kubelet until the socket is re-created, so the supervisor should restart us; then True is
    returned. ``started`` is set once the slices are published and both sockets answer.

    With ``steer`` (:meth:`kubegpu.dra.steering.DeviceSteerer.order`), the devices are listed
    in the order it returns, asked at start and then every ``steer_interval_s``: the slices
    are re-published only when that order changed (the publisher skips identical devices), so
    at most once per interval. With ``steer_wake`` (set by the claim watch,
    :meth:`kubegpu.kube.pool_allocations.WatchedPoolAllocations.changed`, whenever the pool's
    allocations change), it is asked again at once, the interval being only the longest wait.
    A failing ``steer`` is logged and the last order kept: the order steers DRA's first fit,
    the allocator's own accounting decides what fits.

    ``probes`` (:class:`~kubegpu.dra.probes.DriverProbes`, the ``/healthz`` and ``/readyz``
    target) is told of every publish, of both sockets served and removed, and of each
    registration status the kubelet sends.

    ``checkpoint`` is the one already read (else it is read here, raising CheckpointError);
    ``claim`` the caller's :func:`claim_sockets` (else the server takes its own, raising
    SocketInUse while another driver serves).
    """
    preparer = ClaimPreparer(settings, inventory, claims, checkpoint, partitioner)
    # Dynamic MIG: instances no prepared claim holds are leftovers (a crash between create and
    # checkpoint); they would hold slices the allocator believes free.
    preparer.mig.reconcile(
        d.device for c in preparer.checkpoint.claims().values() for d in c.devices
    )
    publisher = ResourceSlicePublisher(
        settings.node_name, settings.naming, slices, dynamic_mig=settings.dynamic_mig
    )

    def current() -> Mapping[str, str] | None:
        return unhealthy() if unhealthy is not None else None

    order: Sequence[int] | None = None
    loop = asyncio.get_running_loop()
    next_steer = loop.time()

    async def steered() -> Sequence[int] | None:
        nonlocal next_steer
        if steer is None or loop.time() < next_steer:
            return order
        next_steer = loop.time() + steer_interval_s
        try:
            return await steer()
        except Exception as exc:  # the API edge's errors vary (HTTP, lightkube, OS)
            log.warning(
                "node %s: cannot read the claims allocated from its pool (device order "
                "kept): %s: %s",
                settings.node_name,
                type(exc).__name__,
                exc,
            )
            return order

    def published() -> None:
        if probes is not None and publisher.generation is not None:
            probes.published(publisher.generation)

    order = await steered()
    try:
        await publisher.publish(inventory, current(), order)
        published()
    except Exception as exc:  # the API edge's errors vary (HTTP, lightkube, OS)
        raise SlicePublishError(
            f"cannot publish the ResourceSlices of node {settings.node_name}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc

    refused = False
    changed = health_changed or asyncio.Event()
    health = DeviceHealthServicer(
        settings.node_name,
        pool_name(settings.node_name),
        inventory,
        lambda: current() or {},
    )

    def on_status(status: RegistrationStatus) -> None:
        nonlocal refused
        if probes is not None:
            probes.registration_status(status.registered, status.error)
        if not status.registered:
            refused = True
            stop.set()
            return
        # A kubelet that (re)starts deletes the node's ResourceSlices of every driver not yet
        # registered with it, ours included: write them again once it has registered us.
        publisher.forget()
        changed.set()

    try:
        async with DraPluginServer(
            preparer, sockets, on_status=on_status, health=health, claim=claim
        ):
            if probes is not None:
                probes.serving(sockets.registration, sockets.dra)
            if started is not None:
                started.set()
            pending = False  # a republish failed and is due again
            while not stop.is_set():
                waits = [retry_s] if pending else []
                if steer is not None:
                    waits.append(max(0.0, next_steer - loop.time()))
                wakes = (stop, changed) if steer_wake is None else (stop, changed, steer_wake)
                await _wait_any(wakes, min(waits) if waits else None)
                if stop.is_set():
                    break
                if steer_wake is not None and steer_wake.is_set():
                    # Cleared before the claims are read: a change while steering wakes us
                    # again, so the last allocation is never left unsteered.
                    steer_wake.clear()
                    next_steer = loop.time()
                steer_due = steer is not None and loop.time() >= next_steer
                if not (changed.is_set() or pending or steer_due):
                    continue
                if changed.is_set():
                    health.notify()  # the kubelet's health streams hear of a flip at once
                changed.clear()
                order = await steered()
                try:
                    await publisher.publish(inventory, current(), order)
                    published()
                    pending = False
                except Exception as exc:  # the API edge's errors vary (HTTP, lightkube, OS)
                    log.warning(
                        "node %s: cannot republish ResourceSlices (retrying in %.0f s): %s",
                        settings.node_name,
                        retry_s,
                        exc,
                    )
                    pending = True
    finally:
        if probes is not None:
            probes.stopped()
    return refused
