"""The emulated kubelet device manager: serves Registration, dials plugins, admits containers.

:class:`KubeletEmulator` serves ``kubelet.sock``, handles ``Register`` (validate, dial back,
read the options, newest registration wins), consumes each plugin's ``ListAndWatch`` stream on a
thread, and admits containers the way ``devicesToAllocate`` does; restart and stop behave as a
kubelet's do to a plugin. What it records and the queries on it are in
:mod:`kubegpu.testing.kubelet.records`, how each RPC is made in
:mod:`kubegpu.testing.kubelet.plugin_client`; the package docstring says how it differs from the
real kubelet.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc

from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubegpu.testing.kubelet.plugin_client import (
    PluginEndpoint,
    allocate_devices,
    check_unix_path,
    device_state_from_wire,
    dial_plugin,
    get_preferred_allocation,
    pre_start_container,
    remove_sockets,
    rpc_error_text,
)
from kubegpu.testing.kubelet.records import DeviceManagerRecords
from kubegpu.testing.kubelet.values import (
    KUBELET_SOCKET_NAME,
    PLUGIN_DIAL_TIMEOUT_S,
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    Allocation,
    AllocationError,
    ContainerKind,
    ContainerResponse,
    KubeletEmulatorError,
    Registration,
    RejectedRegistration,
    SeenDevice,
    is_extended_resource_name,
)
from kubegpu.unix_channels import unix_target

log = logging.getLogger(__name__)


class _RegistrationServicer(dp_grpc.RegistrationServicer):
    def __init__(self, emulator: KubeletEmulator) -> None:
        self._emulator = emulator

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        error = self._emulator._handle_register(request)
        if error is not None:
            # A plain Go error from the kubelet's handler reaches the client as code Unknown.
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


class KubeletEmulator(DeviceManagerRecords):
    """The kubelet's device manager, over real unix sockets, with query helpers for tests.

    Sync API; gRPC runs on its own threads. Use as a context manager or call ``start`` /
    ``stop``. ``pod_resources_socket`` additionally serves PodResources v1 there.
    """

    def __init__(
        self,
        plugin_dir: Path,
        *,
        pod_resources_socket: Path | None = None,
        dial_timeout_s: float = PLUGIN_DIAL_TIMEOUT_S,
        rpc_timeout_s: float = 60.0,
        node_name: str = "emulated-node",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET_NAME
        self.pod_resources_socket = pod_resources_socket
        self.node_name = node_name
        super().__init__(clock)
        self._dial_timeout_s = dial_timeout_s
        self._rpc_timeout_s = rpc_timeout_s
        self._server: grpc.Server | None = None
        self._pod_resources_server: grpc.Server | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> KubeletEmulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Create the directory, delete stale sockets, and serve ``kubelet.sock``."""
        if self._server is not None:
            raise KubeletEmulatorError("kubelet emulator already started")
        self.plugin_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        remove_sockets(self.plugin_dir)
        check_unix_path(self.kubelet_socket)
        target = unix_target(self.kubelet_socket)
        # Register blocks while it dials back and calls the plugin: a few workers suffice.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet")
        )
        dp_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        server.add_insecure_port(target)
        server.start()
        self._server = server
        if self.pod_resources_socket is not None:
            self._start_pod_resources()
        log.info("kubelet emulator serving %s on node %s", self.kubelet_socket, self.node_name)

    def stop(self) -> None:
        """Stop serving, close every plugin connection and remove our own sockets."""
        self._shutdown()
        self.kubelet_socket.unlink(missing_ok=True)
        if self.pod_resources_socket is not None:
            self.pod_resources_socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """What a kubelet restart looks like to a plugin (fact sheet 1.6 and 1.10).

        The server and every plugin connection go away, every unix socket in the directory is
        deleted (plugin sockets included), then a new ``kubelet.sock`` is served. Allocations
        survive (checkpoint); device lists restart empty until the plugin registers again.
        """
        self._shutdown()
        with self._lock:
            for resource in list(self._devices):
                self._record_update(resource, {}, self._clock(), "restart")
        self.start()

    def _shutdown(self) -> None:
        with self._lock:
            server, self._server = self._server, None
            pr_server, self._pod_resources_server = self._pod_resources_server, None
            endpoints = [*self._endpoints.values(), *self._retired]
            self._endpoints.clear()
            self._retired.clear()
            for endpoint in endpoints:
                endpoint.closing = True
        if server is not None:
            server.stop(grace=None).wait()
        if pr_server is not None:
            pr_server.stop(grace=None).wait()
        for endpoint in endpoints:
            self._close_endpoint(endpoint)

    def _close_endpoint(self, endpoint: PluginEndpoint) -> None:
        with self._lock:
            endpoint.closing = True
            call = endpoint.call
        if call is not None:
            call.cancel()
        endpoint.channel.close()
        thread = endpoint.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _start_pod_resources(self) -> None:
        # Imported here so the device-plugin-only path does not need the podresources stubs.
        from kubegpu.testing.podresources import serve_pod_resources

        assert self.pod_resources_socket is not None
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.unlink(missing_ok=True)
        self._pod_resources_server = serve_pod_resources(self, self.pod_resources_socket)

    # -- Register --------------------------------------------------------------------------

    def _handle_register(self, request: dp.RegisterRequest) -> str | None:
        """The kubelet's ``Register`` handler; returns the error text or None."""
        error = self._validate_and_connect(request)
        if error is not None:
            log.warning(
                "node %s: rejected registration of %s (endpoint %s, version %s): %s",
                self.node_name,
                request.resource_name,
                request.endpoint,
                request.version,
                error,
            )
            with self._lock:
                self._rejected.append(
                    RejectedRegistration(
                        request.resource_name, request.endpoint, request.version, error
                    )
                )
                self._changed.notify_all()
        return error

    def _validate_and_connect(self, request: dp.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            supported = "[" + " ".join(f'"{v}"' for v in SUPPORTED_VERSIONS) + "]"
            return (
                f'requested API version "{request.version}" is not supported by kubelet. '
                f"Supported version is {supported}"
            )
        if not is_extended_resource_name(request.resource_name):
            return f'the ResourceName "{request.resource_name}" is invalid'
        socket_path = self.plugin_dir / request.endpoint
        try:
            channel = dial_plugin(socket_path, self._dial_timeout_s)
        except KubeletEmulatorError as error:
            return f"failed to dial device plugin: {error}"
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=self._rpc_timeout_s)
        except grpc.RpcError as error:
            channel.close()
            code, details = rpc_error_text(error)
            return f"failed to get device plugin options: rpc error: code = {code} desc = {details}"
        registration = Registration(
            resource_name=request.resource_name,
            endpoint=request.endpoint,
            version=request.version,
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
            registered_at_monotonic_s=self._clock(),
        )
        endpoint = PluginEndpoint(registration=registration, channel=channel, stub=stub)
        with self._lock:
            if self._server is None:
                channel.close()
                return "kubelet is shutting down"
            previous = self._endpoints.get(request.resource_name)
            if previous is not None:
                # Newest registration wins; the kubelet leaves the old connection open.
                self._retired.append(previous)
            self._endpoints[request.resource_name] = endpoint
            self._devices.setdefault(request.resource_name, {})
            self._updates.setdefault(request.resource_name, [])
            self._registrations.append(registration)
            endpoint.thread = threading.Thread(
                target=self._consume_list_and_watch,
                args=(endpoint,),
                name=f"listandwatch-{request.resource_name}",
                daemon=True,
            )
            endpoint.thread.start()
            self._changed.notify_all()
        log.info(
            "node %s: registered %s from endpoint %s (preferred allocation %s, pre-start %s)",
            self.node_name,
            registration.resource_name,
            registration.endpoint,
            registration.get_preferred_allocation_available,
            registration.pre_start_required,
        )
        return None

    # -- ListAndWatch ----------------------------------------------------------------------

    def _consume_list_and_watch(self, endpoint: PluginEndpoint) -> None:
        reason = "stream ended"
        try:
            call = endpoint.stub.ListAndWatch(dp.Empty())
            with self._lock:
                endpoint.call = call
                closing = endpoint.closing
            if closing:
                call.cancel()
            for response in call:
                self._apply_list_and_watch(endpoint, response)
        except grpc.RpcError as error:
            code, details = rpc_error_text(error)
            reason = f"{code}: {details}"
        except ValueError as error:  # channel closed under us
            reason = str(error)
        self._on_stream_end(endpoint, reason)

    def _apply_list_and_watch(
        self, endpoint: PluginEndpoint, response: dp.ListAndWatchResponse
    ) -> None:
        resource = endpoint.registration.resource_name
        received = self._clock()
        devices = {d.ID: device_state_from_wire(d) for d in response.devices}
        with self._lock:
            if endpoint.closing or self._endpoints.get(resource) is not endpoint:
                return
            self._record_update(resource, devices, received, "list_and_watch")
        log.debug(
            "node %s: ListAndWatch update for %s: %d devices, %d healthy",
            self.node_name,
            resource,
            len(devices),
            sum(d.healthy for d in devices.values()),
        )

    def _on_stream_end(self, endpoint: PluginEndpoint, reason: str) -> None:
        resource = endpoint.registration.resource_name
        with self._lock:
            if endpoint.closing:
                return
            # The kubelet's cleanup looks the client up by resource name, so a superseded
            # stream ending disconnects whichever endpoint is current for the resource.
            current = self._endpoints.get(resource)
            if current is None:
                return
            current.stopped = True
            unhealthy = {
                device_id: SeenDevice(device_id, UNHEALTHY, state.numa_nodes)
                for device_id, state in self._devices.get(resource, {}).items()
            }
            self._record_update(resource, unhealthy, self._clock(), "disconnect")
        log.warning(
            "node %s: ListAndWatch ended unexpectedly for device plugin %s (endpoint %s): %s",
            self.node_name,
            resource,
            endpoint.registration.endpoint,
            reason,
        )

    # -- allocation ------------------------------------------------------------------------

    def allocate(
        self,
        resource: str,
        count: int,
        *,
        must_include: Sequence[str] = (),
        pod_uid: str | None = None,
        pod_name: str | None = None,
        namespace: str = "default",
        container: str = "main",
        kind: ContainerKind = "app",
    ) -> Allocation:
        """Admit one container asking for ``count`` devices of ``resource``, like the kubelet.

        Reuses the recorded allocation for the same (pod, container, resource) without calling
        the plugin. Otherwise picks from healthy, unallocated devices (``must_include`` first,
        standing in for devices reused from an init container), asks GetPreferredAllocation
        when the plugin offers it, calls Allocate with one container request, then
        PreStartContainer when the plugin requires it. ``kind`` says what the container is in
        the pod spec (the caller knows it, as the kubelet does): it decides whether PodResources
        reports it. Raises ``AllocationError``.
        """
        if count < 1:
            raise AllocationError(f"count must be at least 1, got {count}")
        pod_uid = pod_uid or str(uuid.uuid4())
        pod_name = pod_name or f"pod-{pod_uid[:8]}"
        key = (pod_uid, container, resource)
        with self._lock:
            cached = self._allocations.get(key)
        if cached is not None:
            return cached
        endpoint = self._current_endpoint(resource)
        registration = endpoint.registration
        devices, must, free = self._devices_to_allocate(resource, count, must_include, pod_uid)
        needed = count - len(must)
        preferred: tuple[str, ...] | None = None
        if registration.get_preferred_allocation_available:
            available = sorted({*free, *must})
            preferred = get_preferred_allocation(
                endpoint.stub, available, must, count, self._rpc_timeout_s
            )
            chosen = list(preferred)
        else:
            chosen = [*must, *free[:needed]]
        response = allocate_devices(endpoint.stub, chosen, self._rpc_timeout_s)
        pre_start_called = False
        if registration.pre_start_required:
            pre_start_container(endpoint.stub, chosen)
            pre_start_called = True
        allocation = Allocation(
            pod_uid=pod_uid,
            pod_name=pod_name,
            namespace=namespace,
            container=container,
            resource_name=resource,
            device_ids=tuple(chosen),
            response=response,
            preferred_device_ids=preferred,
            pre_start_called=pre_start_called,
            numa_nodes={d: devices[d].numa_nodes for d in chosen},
            kind=kind,
        )
        with self._lock:
            self._allocations[key] = allocation
            self._changed.notify_all()
        log.info(
            "node %s: allocated %s %s to pod %s/%s %s container %s",
            self.node_name,
            resource,
            ",".join(chosen),
            namespace,
            pod_name,
            kind,
            container,
        )
        return allocation

    def allocate_raw(self, resource: str, device_ids: Iterable[str]) -> ContainerResponse:
        """Send one Allocate with exactly ``device_ids`` (unknown ones too); nothing is recorded."""
        return allocate_devices(
            self._current_endpoint(resource).stub, list(device_ids), self._rpc_timeout_s
        )

    def start_container(self, pod_uid: str, container: str) -> int:
        """A container (re)start: PreStartContainer for each of its resources that requires it.

        Allocate is not called again; returns how many PreStartContainer calls were made.
        """
        with self._lock:
            mine = [
                a
                for a in self._allocations.values()
                if (a.pod_uid, a.container) == (pod_uid, container)
            ]
        if not mine:
            raise AllocationError(f"pod {pod_uid} container {container} has no allocation")
        calls = 0
        for allocation in mine:
            endpoint = self._current_endpoint(allocation.resource_name)
            if endpoint.registration.pre_start_required:
                pre_start_container(endpoint.stub, allocation.device_ids)
                calls += 1
        return calls

    def release(self, pod_uid: str) -> list[str]:
        """The pod ended: its devices return to the free pool. Returns the freed ids.

        The plugin is not told (there is no Deallocate RPC), exactly as with the kubelet.
        """
        with self._lock:
            keys = [key for key in self._allocations if key[0] == pod_uid]
            freed = [d for key in keys for d in self._allocations.pop(key).device_ids]
            self._changed.notify_all()
        return freed
