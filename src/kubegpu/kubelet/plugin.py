"""The device plugin gRPC edge: one asyncio gRPC server per advertised resource.

The servicer is thin: it converts protobuf to our values, asks the :class:`ResourcePlan` (and,
through it, the placement module), and converts back; domain errors become gRPC statuses here
and nowhere else. Every stream watches one :class:`~kubegpu.kubelet.board.DeviceBoard`, which
reads health from the node's one record keyed by physical GPU, so every stream of every resource
sees a change at once and every id of a GPU (replicas included) flips together. Everything runs
on one asyncio loop, so an open ``ListAndWatch`` stream costs a suspended coroutine, not a
worker thread, and never starves ``Allocate``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc
from grpc import aio

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import NodeInventory
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.resources import (
    AllocateAnswer,
    AllocationError,
    AllocationRefused,
    DeviceState,
    ResourcePlan,
)
from kubegpu.placement.topology import PreferenceError, ReplicaPolicy
from kubegpu.socket_claim import SocketClaim, socket_identity
from kubegpu.unix_channels import unix_aio_channel

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# Longest status message we send: it travels in gRPC trailers, which clients cap (8 KiB by
# default) and fail the call on, whatever its code.
MAX_STATUS_CHARS = 1000
# The kubelet itself gives up dialing us after 10 s; waiting longer for it is pointless.
REGISTER_TIMEOUT_S = 10.0
# What owns a claimed socket, for the message a second agent logs while it waits.
ROLE = "node agent"


def _device_message(state: DeviceState) -> api_pb2.Device:
    device = api_pb2.Device(ID=state.device_id, health=HEALTHY if state.healthy else UNHEALTHY)
    if state.numa_node is not None:
        device.topology.nodes.add(ID=state.numa_node)
    return device


def _allocate_message(alloc: AllocateAnswer) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=alloc.envs,
        annotations=alloc.annotations,
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in alloc.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in alloc.device_nodes
        ],
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in alloc.cdi_devices],
    )


class AllocationHooks(Protocol):
    """Answers GetPreferredAllocation / Allocate in place of the plan (card-level sharing)."""

    def handles(self, plan: ResourcePlan) -> bool: ...

    async def preferred(
        self, plan: ResourcePlan, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...] | None:
        """The ids to prefer, or None for the plan's own answer."""
        ...

    async def allocate(self, plan: ResourcePlan, device_ids: Sequence[str]) -> AllocateAnswer:
        """Raises AllocationError (INVALID_ARGUMENT) or AllocationRefused (its code)."""
        ...


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        plan: ResourcePlan,
        inventory: NodeInventory,
        config: AgentConfig,
        board: DeviceBoard,
        node_name: str,
        hooks: AllocationHooks | None = None,
    ) -> None:
        self.plan = plan
        self.inventory = inventory
        self.config = config
        self.board = board
        self.node = node_name
        self.hooks = hooks if hooks is not None and hooks.handles(plan) else None
        self.policy = ReplicaPolicy(config.flags.plugin.shared_devices_allocation_policy)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: aio.ServicerContext[Any, Any]
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=self.config.flags.plugin.pre_start_container,
            get_preferred_allocation_available=True,
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        # Full list at once, then a full list after every change; the stream never ends on
        # its own because the kubelet treats an ended stream as a dead plugin.
        version = self.board.version
        last: list[DeviceState] | None = None
        while True:
            states = self.plan.states(self.board.unusable(self.plan.resource_name))
            if states != last:
                bad = [s.device_id for s in states if not s.healthy]
                log.info(
                    "node %s resource %s: sending %d devices (%d unhealthy%s)",
                    self.node,
                    self.plan.resource_name,
                    len(states),
                    len(bad),
                    f": {', '.join(bad[:8])}{'…' if len(bad) > 8 else ''}" if bad else "",
                )
                yield api_pb2.ListAndWatchResponse(devices=[_device_message(s) for s in states])
                last = states
            version = await self.board.wait_for_change(version)

    async def _refuse(
        self, context: aio.ServicerContext[Any, Any], verb: str, err: Exception
    ) -> NoReturn:
        """Log and answer a refusal: INVALID_ARGUMENT for a malformed request, the refusal's
        own code otherwise; the message cut to ``MAX_STATUS_CHARS`` (it travels in trailers)."""
        code = err.code if isinstance(err, AllocationRefused) else "INVALID_ARGUMENT"
        text = str(err)
        if len(text) > MAX_STATUS_CHARS:
            text = text[: MAX_STATUS_CHARS - 1] + "…"
        log.warning(
            "node %s resource %s: %s refused (%s): %s",
            self.node,
            self.plan.resource_name,
            verb,
            code,
            text,
        )
        await context.abort(grpc.StatusCode[code], text)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: aio.ServicerContext[Any, Any]
    ) -> api_pb2.PreferredAllocationResponse:
        response = api_pb2.PreferredAllocationResponse()
        for creq in request.container_requests:
            must_include = list(creq.must_include_deviceIDs)
            try:
                available = self.plan.check_preferred(
                    list(creq.available_deviceIDs),
                    must_include,
                    creq.allocation_size,
                    self.board.unusable(self.plan.resource_name),
                )
                steered = None
                if self.hooks is not None:
                    steered = await self.hooks.preferred(
                        self.plan, available, must_include, creq.allocation_size
                    )
                ids = steered or self.plan.preferred(
                    self.inventory, available, must_include, creq.allocation_size, self.policy
                )
            except (AllocationError, AllocationRefused, PreferenceError) as err:
                await self._refuse(context, "preferred allocation", err)
            response.container_responses.add(deviceIDs=ids)
        return response

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocateResponse:
        response = api_pb2.AllocateResponse()
        for creq in request.container_requests:
            try:
                self.plan.check_allocate(list(creq.devices_ids), self.board.unhealthy)
                if self.hooks is not None:
                    alloc = await self.hooks.allocate(self.plan, list(creq.devices_ids))
                else:
                    alloc = self.plan.allocate(self.config, list(creq.devices_ids))
            except (AllocationError, AllocationRefused) as err:
                await self._refuse(context, "allocate", err)
            log.info(
                "node %s resource %s: allocated devices %s",
                self.node,
                self.plan.resource_name,
                ",".join(creq.devices_ids),
            )
            response.container_responses.append(_allocate_message(alloc))
        return response

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: aio.ServicerContext[Any, Any]
    ) -> api_pb2.PreStartContainerResponse:
        try:
            self.plan.check_ids(list(request.devices_ids))
        except AllocationError as err:
            await self._refuse(context, "pre-start", err)
        log.info(
            "node %s resource %s: pre-start for devices %s (nothing to do)",
            self.node,
            self.plan.resource_name,
            ",".join(request.devices_ids),
        )
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """Serves one resource on ``<kubelet_dir>/<plan.socket_name>`` and registers it.

    ``claim`` is the :class:`SocketClaim` on that socket when the caller holds it (the agent
    keeps its claims across restarts of the server, so no other process slips in between);
    without one, ``start`` takes one and ``stop`` gives it back."""

    def __init__(
        self,
        servicer: DevicePluginServicer,
        kubelet_dir: Path,
        *,
        stop_grace_s: float = 0.2,
        claim: SocketClaim | None = None,
    ) -> None:
        self.servicer = servicer
        self.kubelet_dir = kubelet_dir
        self.socket_path = kubelet_dir / servicer.plan.socket_name
        self.stop_grace_s = stop_grace_s
        self._server: aio.Server | None = None
        self.socket_identity: tuple[int, int] | None = None
        self.claim = claim
        self._own_claim = False

    @property
    def resource_name(self) -> str:
        return self.servicer.plan.resource_name

    async def start(self) -> None:
        """Bind a fresh socket (removing a stale file first) and serve; raises
        :class:`~kubegpu.socket_claim.SocketInUse`, touching nothing, while another process
        owns the socket."""
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        if self.claim is None:
            self.claim = SocketClaim.acquire(self.socket_path, role=ROLE)
            self._own_claim = True
        self.socket_path.unlink(missing_ok=True)
        server = aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self.socket_identity = socket_identity(self.socket_path)
        log.info(
            "node %s resource %s: serving on %s",
            self.servicer.node,
            self.resource_name,
            self.socket_path,
        )

    async def register(self) -> None:
        """Call the kubelet's ``Register``; raises ``grpc.aio.AioRpcError`` or ``OSError``."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource_name,
            options=api_pb2.DevicePluginOptions(
                pre_start_required=self.servicer.config.flags.plugin.pre_start_container,
                get_preferred_allocation_available=True,
            ),
        )
        kubelet_socket = self.kubelet_dir / KUBELET_SOCKET
        async with unix_aio_channel(kubelet_socket) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            await stub.Register(request, timeout=REGISTER_TIMEOUT_S, wait_for_ready=False)
        log.info(
            "node %s resource %s: registered with the kubelet (endpoint %s, %d devices)",
            self.servicer.node,
            self.resource_name,
            self.socket_path.name,
            len(self.servicer.plan.devices),
        )

    async def stop(self, *, remove_socket: bool = True) -> None:
        server, self._server = self._server, None
        if server is not None:
            # Ending the stream is what the kubelet needs to see before a re-registration.
            await server.stop(self.stop_grace_s)
        # Only our own file: a successor process may already have bound the same path.
        if remove_socket and self.socket_intact():
            self.socket_path.unlink(missing_ok=True)
        if self._own_claim and self.claim is not None:
            self.claim.release()
            self.claim, self._own_claim = None, False

    def socket_intact(self) -> bool:
        """Our socket file still exists and is the one we bound (inode and ctime, because
        inodes are reused at once after a delete)."""
        return self.socket_identity is not None and socket_identity(self.socket_path) == (
            self.socket_identity
        )
