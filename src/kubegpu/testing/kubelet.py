"""A kubelet device manager stand-in that drives a device plugin over the real wire protocol.

What it owns: the kubelet side of device plugin API v1beta1 (and, optionally, PodResources v1)
for tests, benchmarks and ``kubegpu emulate-node``. It serves ``v1beta1.Registration`` on
``<plugin_dir>/kubelet.sock`` over a real unix socket and behaves like the kubelet's device
manager as described in the protocol fact sheet (section 1):

* ``Register`` is validated exactly like the kubelet (version, extended resource name) and
  answers with the kubelet's error texts; inside the call it dials ``<plugin_dir>/<endpoint>``
  and calls ``GetDevicePluginOptions``; the newest registration for a resource wins.
* ``ListAndWatch`` is consumed on a background thread; every message is a full snapshot that
  replaces the device list. When the stream ends the resource's devices turn unhealthy.
* ``allocate`` chooses devices the way ``devicesToAllocate`` does with topology policy
  ``none``, calls ``GetPreferredAllocation`` / ``Allocate`` / ``PreStartContainer`` as the
  option flags say and keeps allocations (the checkpoint) across ``restart``.
* ``restart`` does what a kubelet restart looks like to a plugin: the server goes away, every
  unix socket in the directory is deleted, and a fresh ``kubelet.sock`` appears.

Deliberate differences from the kubelet, all in the direction of catching plugin bugs sooner:
``GetPreferredAllocation`` answers are validated strictly (the kubelet silently intersects and
fills up), device ids are offered in sorted order (the kubelet uses Go map order), and RPCs the
kubelet sends without a deadline get a generous one (``rpc_timeout_s``) so a hung plugin fails a
test instead of hanging it. Wire messages never leave this module: callers get frozen
dataclasses.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import grpc

from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubegpu.testing.waiting import wait_until
from kubegpu.unix_channels import unix_channel, unix_target

log = logging.getLogger(__name__)

UpdateSource = Literal["list_and_watch", "disconnect", "restart"]
# What the kubelet knows of a container from the pod spec: an app container, a regular init
# container, or a restartable one (a sidecar: an init container with restartPolicy: Always).
# PodResources reports sidecars and app containers only (fact sheet 2.3).
ContainerKind = Literal["app", "init", "sidecar"]

API_VERSION = "v1beta1"
SUPPORTED_VERSIONS: tuple[str, ...] = (API_VERSION,)
KUBELET_SOCKET_NAME = "kubelet.sock"
CHECKPOINT_NAME = "kubelet_internal_checkpoint"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# kubelet: blocking dial of the plugin socket during Register; deadline on PreStartContainer.
PLUGIN_DIAL_TIMEOUT_S = 10.0
PRE_START_CONTAINER_TIMEOUT_S = 30.0
# sun_path is 108 bytes including the terminating NUL.
MAX_UNIX_SOCKET_PATH_BYTES = 107

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME_PART_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def is_qualified_name(value: str) -> bool:
    """apimachinery ``IsQualifiedName``: ``[dns-subdomain/]name``, name ≤63 chars."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.match(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME_PART_RE.match(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes ``IsExtendedResourceName``, the check the kubelet applies in ``Register``.

    Native resources (no ``/``, or containing ``kubernetes.io/``) and ``requests.``-prefixed
    names are rejected; ``requests.<name>`` must be a qualified name.
    """
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return is_qualified_name(f"requests.{name}")


class KubeletEmulatorError(Exception):
    """The emulator could not do what was asked (not started, socket path too long, ...)."""


class AllocationError(KubeletEmulatorError):
    """Device admission failed; the real kubelet would fail the pod (UnexpectedAdmissionError).

    ``grpc_code`` is the plugin's status code name when an RPC to the plugin failed.
    """

    def __init__(self, message: str, grpc_code: str | None = None) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


@dataclass(frozen=True)
class Registration:
    """One accepted ``Register`` call and the options read back with GetDevicePluginOptions."""

    resource_name: str
    endpoint: str
    version: str
    pre_start_required: bool
    get_preferred_allocation_available: bool
    registered_at_monotonic_s: float


@dataclass(frozen=True)
class RejectedRegistration:
    """A ``Register`` call the emulator answered with an error, and that error's text."""

    resource_name: str
    endpoint: str
    version: str
    error: str


@dataclass(frozen=True)
class SeenDevice:
    """One advertised device as the kubelet last saw it."""

    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        # The kubelet treats anything but exactly "Healthy" as unhealthy.
        return self.health == HEALTHY


@dataclass(frozen=True)
class DeviceUpdate:
    """One change of a resource's device list.

    ``source`` is ``list_and_watch`` for a stream message, ``disconnect`` when the stream
    ended and every device was marked unhealthy, and ``restart`` when a kubelet restart emptied
    the list. ``received_at_monotonic_s`` is taken with
    ``time.monotonic()`` as the message arrives, for "event -> stream update" latency figures.
    """

    resource_name: str
    sequence: int
    received_at_monotonic_s: float
    source: UpdateSource
    devices: Mapping[str, SeenDevice]


@dataclass(frozen=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class DeviceNodeSpec:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class ContainerResponse:
    """A plugin's ``ContainerAllocateResponse``, as our own value."""

    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...]
    devices: tuple[DeviceNodeSpec, ...]
    annotations: Mapping[str, str]
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True)
class Allocation:
    """Devices given to one (pod, container, resource), as the kubelet checkpoints them.

    ``preferred_device_ids`` is the plugin's GetPreferredAllocation answer, or ``None`` when the
    plugin does not advertise the RPC. ``numa_nodes`` maps each device to its NUMA nodes at
    allocation time (PodResources reports these). ``kind`` is the container's place in the pod
    spec: a regular init container's devices stay the pod's, but PodResources never lists it.
    """

    pod_uid: str
    pod_name: str
    namespace: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]
    response: ContainerResponse
    preferred_device_ids: tuple[str, ...] | None
    pre_start_called: bool
    numa_nodes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    kind: ContainerKind = "app"

    @property
    def envs(self) -> Mapping[str, str]:
        return self.response.envs

    @property
    def mounts(self) -> tuple[MountSpec, ...]:
        return self.response.mounts

    @property
    def devices(self) -> tuple[DeviceNodeSpec, ...]:
        return self.response.devices

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.response.annotations

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        return self.response.cdi_devices


def container_response_from_wire(message: dp.ContainerAllocateResponse) -> ContainerResponse:
    return ContainerResponse(
        envs=dict(message.envs),
        mounts=tuple(MountSpec(m.container_path, m.host_path, m.read_only) for m in message.mounts),
        devices=tuple(
            DeviceNodeSpec(d.container_path, d.host_path, d.permissions) for d in message.devices
        ),
        annotations=dict(message.annotations),
        cdi_devices=tuple(c.name for c in message.cdi_devices),
    )


def device_state_from_wire(message: dp.Device) -> SeenDevice:
    numa = tuple(sorted(node.ID for node in message.topology.nodes))
    return SeenDevice(id=message.ID, health=message.health, numa_nodes=numa)


def _check_unix_path(path: Path) -> None:
    if len(os.fsencode(str(path))) > MAX_UNIX_SOCKET_PATH_BYTES:
        raise KubeletEmulatorError(
            f"unix socket path {path} is longer than {MAX_UNIX_SOCKET_PATH_BYTES} bytes; "
            "use a shorter directory"
        )


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def remove_sockets(directory: Path) -> list[Path]:
    """Delete every unix socket directly in ``directory``, like kubelet start-up does.

    Regular files (the checkpoint) and sub-directories stay.
    """
    removed: list[Path] = []
    for entry in directory.iterdir():
        if entry.name != CHECKPOINT_NAME and _is_socket(entry):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _rpc_error_text(error: grpc.RpcError) -> tuple[str, str]:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return (code.name if code is not None else "UNKNOWN", str(details))


@dataclass
class _Endpoint:
    """Mutable kubelet-side state of one plugin connection (one registration)."""

    registration: Registration
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    closing: bool = False
    stopped: bool = False
    call: Any = None
    thread: threading.Thread | None = None


class _RegistrationServicer(dp_grpc.RegistrationServicer):
    def __init__(self, emulator: KubeletEmulator) -> None:
        self._emulator = emulator

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        error = self._emulator._handle_register(request)
        if error is not None:
            # A plain Go error from the kubelet's handler reaches the client as code Unknown.
            context.abort(grpc.StatusCode.UNKNOWN, error)
        return dp.Empty()


class KubeletEmulator:
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
        self._dial_timeout_s = dial_timeout_s
        self._rpc_timeout_s = rpc_timeout_s
        self._clock = clock
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._server: grpc.Server | None = None
        self._pod_resources_server: grpc.Server | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        # Superseded endpoints: the kubelet does not close them; we do at stop/restart.
        self._retired: list[_Endpoint] = []
        self._registrations: list[Registration] = []
        self._rejected: list[RejectedRegistration] = []
        self._devices: dict[str, dict[str, SeenDevice]] = {}
        self._updates: dict[str, list[DeviceUpdate]] = {}
        self._allocations: dict[tuple[str, str, str], Allocation] = {}

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
        _check_unix_path(self.kubelet_socket)
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

    def _close_endpoint(self, endpoint: _Endpoint) -> None:
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
            channel = self._dial(socket_path)
        except KubeletEmulatorError as error:
            return f"failed to dial device plugin: {error}"
        stub = dp_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(dp.Empty(), timeout=self._rpc_timeout_s)
        except grpc.RpcError as error:
            channel.close()
            code, details = _rpc_error_text(error)
            return f"failed to get device plugin options: rpc error: code = {code} desc = {details}"
        registration = Registration(
            resource_name=request.resource_name,
            endpoint=request.endpoint,
            version=request.version,
            pre_start_required=options.pre_start_required,
            get_preferred_allocation_available=options.get_preferred_allocation_available,
            registered_at_monotonic_s=self._clock(),
        )
        endpoint = _Endpoint(registration=registration, channel=channel, stub=stub)
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

    def _dial(self, socket_path: Path) -> grpc.Channel:
        # The kubelet's dial blocks up to 10 s; waiting for the file first keeps the common
        # failure (no socket) from burning gRPC's reconnect backoff.
        deadline = time.monotonic() + self._dial_timeout_s
        try:
            # The plugin may be another process: nothing announces its socket but the file.
            wait_until(
                lambda: _is_socket(socket_path),
                timeout_s=self._dial_timeout_s,
                what=f"unix socket at {socket_path}",
                poll_s=0.01,
            )
        except TimeoutError:
            raise KubeletEmulatorError(f"no unix socket at {socket_path}") from None
        _check_unix_path(socket_path)
        channel = unix_channel(socket_path, ("grpc.default_authority", "localhost"))
        try:
            grpc.channel_ready_future(channel).result(timeout=max(0.0, deadline - time.monotonic()))
        except grpc.FutureTimeoutError as error:
            channel.close()
            raise KubeletEmulatorError(
                f"context deadline exceeded dialing {socket_path}"
            ) from error
        return channel

    # -- ListAndWatch ----------------------------------------------------------------------

    def _consume_list_and_watch(self, endpoint: _Endpoint) -> None:
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
            code, details = _rpc_error_text(error)
            reason = f"{code}: {details}"
        except ValueError as error:  # channel closed under us
            reason = str(error)
        self._on_stream_end(endpoint, reason)

    def _apply_list_and_watch(self, endpoint: _Endpoint, response: dp.ListAndWatchResponse) -> None:
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

    def _record_update(
        self,
        resource: str,
        devices: dict[str, SeenDevice],
        received: float,
        source: UpdateSource,
    ) -> None:
        updates = self._updates.setdefault(resource, [])
        update = DeviceUpdate(
            resource_name=resource,
            sequence=len(updates) + 1,
            received_at_monotonic_s=received,
            source=source,
            devices=dict(devices),
        )
        updates.append(update)
        self._devices[resource] = dict(devices)
        self._changed.notify_all()

    def _on_stream_end(self, endpoint: _Endpoint, reason: str) -> None:
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

    # -- queries ---------------------------------------------------------------------------

    @property
    def registrations(self) -> list[Registration]:
        """Every accepted registration, oldest first, across restarts."""
        with self._lock:
            return list(self._registrations)

    @property
    def rejected_registrations(self) -> list[RejectedRegistration]:
        with self._lock:
            return list(self._rejected)

    def registration(self, resource: str) -> Registration | None:
        """The current (newest) registration for ``resource``, if its endpoint is known."""
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return endpoint.registration if endpoint is not None else None

    def is_connected(self, resource: str) -> bool:
        """A registered endpoint whose ListAndWatch stream has not ended."""
        with self._lock:
            endpoint = self._endpoints.get(resource)
            return endpoint is not None and not endpoint.stopped

    def resources(self) -> list[str]:
        with self._lock:
            return sorted(self._devices)

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        """The latest device list of ``resource`` (empty when unknown)."""
        with self._lock:
            return dict(self._devices.get(resource, {}))

    def updates(self, resource: str) -> list[DeviceUpdate]:
        """Every device-list change of ``resource``, oldest first."""
        with self._lock:
            return list(self._updates.get(resource, []))

    def update_count(self, resource: str) -> int:
        with self._lock:
            return len(self._updates.get(resource, []))

    def capacity(self, resource: str) -> int:
        """What the node would report as ``capacity[resource]``: all known devices."""
        return len(self.devices(resource))

    def allocatable(self, resource: str) -> int:
        """What the node would report as ``allocatable[resource]``: healthy devices."""
        return sum(state.healthy for state in self.devices(resource).values())

    def allocations(self) -> list[Allocation]:
        with self._lock:
            return list(self._allocations.values())

    def wait_for_registration(
        self, resource: str, timeout_s: float = 10.0, *, count: int = 1
    ) -> Registration:
        """Block until ``resource`` has been registered ``count`` times; returns that one."""

        def ready() -> bool:
            return sum(r.resource_name == resource for r in self._registrations) >= count

        self._wait(ready, timeout_s, lambda: f"registration #{count} of {resource}")
        with self._lock:
            matching = [r for r in self._registrations if r.resource_name == resource]
            return matching[count - 1]

    def wait_for_devices(
        self,
        resource: str,
        predicate: Callable[[Mapping[str, SeenDevice]], bool] = bool,
        timeout_s: float = 10.0,
        *,
        after_sequence: int | None = None,
    ) -> DeviceUpdate:
        """Block until the device list of ``resource`` satisfies ``predicate``.

        By default waits until the *current* list does and returns the latest update. With
        ``after_sequence`` returns the first update newer than that sequence number which
        satisfies it (for latency figures: take ``update_count`` before the event). The default
        predicate waits for a non-empty device list.
        """

        def find() -> DeviceUpdate | None:
            updates = self._updates.get(resource, [])
            if after_sequence is None:
                latest = updates[-1:]
                return latest[0] if latest and predicate(latest[0].devices) else None
            for update in updates:
                if update.sequence > after_sequence and predicate(update.devices):
                    return update
            return None

        self._wait(lambda: find() is not None, timeout_s, lambda: f"devices of {resource}")
        with self._lock:
            found = find()
        assert found is not None
        return found

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"timed out after {timeout_s:g}s waiting for {what()}; {self._describe()}"
                    )
                self._changed.wait(remaining)

    def _describe(self) -> str:
        accepted = [f"{r.resource_name}@{r.endpoint}" for r in self._registrations]
        rejected = [f"{r.resource_name}@{r.endpoint}: {r.error}" for r in self._rejected]
        counts = {res: len(devs) for res, devs in self._devices.items()}
        return f"registrations={accepted} rejected={rejected} devices={counts}"

    # -- allocation ------------------------------------------------------------------------

    def _current_endpoint(self, resource: str) -> _Endpoint:
        with self._lock:
            endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise AllocationError(f"resource {resource} is not registered with the kubelet")
        if endpoint.stopped:
            raise AllocationError(f"endpoint {resource} has been stopped")
        return endpoint

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
        with self._lock:
            devices = dict(self._devices.get(resource, {}))
            owner = {
                device_id: allocation.pod_uid
                for allocation in self._allocations.values()
                if allocation.resource_name == resource
                for device_id in allocation.device_ids
            }
        must = list(dict.fromkeys(must_include))
        for device_id in must:
            if device_id not in devices or not devices[device_id].healthy:
                raise AllocationError(
                    f"must-include device {device_id} is not a healthy {resource} device"
                )
            if owner.get(device_id, pod_uid) != pod_uid:
                raise AllocationError(f"must-include device {device_id} belongs to another pod")
        if len(must) > count:
            raise AllocationError(f"{len(must)} must-include devices but only {count} requested")
        if not any(state.healthy for state in devices.values()):
            raise AllocationError(
                f"no healthy devices present; cannot allocate unhealthy devices {resource}"
            )
        free = sorted(
            device_id
            for device_id, state in devices.items()
            if state.healthy and device_id not in owner and device_id not in must
        )
        needed = count - len(must)
        if needed > len(free):
            raise AllocationError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(free)}"
            )
        preferred: tuple[str, ...] | None = None
        if registration.get_preferred_allocation_available:
            available = sorted({*free, *must})
            preferred = self._get_preferred(endpoint, available, must, count)
            chosen = list(preferred)
        else:
            chosen = [*must, *free[:needed]]
        response = self._call_allocate(endpoint, chosen)
        pre_start_called = False
        if registration.pre_start_required:
            self._call_pre_start(endpoint, chosen)
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

    def _get_preferred(
        self, endpoint: _Endpoint, available: list[str], must: list[str], size: int
    ) -> tuple[str, ...]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must,
                    allocation_size=size,
                )
            ]
        )
        try:
            response = endpoint.stub.GetPreferredAllocation(request, timeout=self._rpc_timeout_s)
        except grpc.RpcError as error:
            code, details = _rpc_error_text(error)
            raise AllocationError(
                f"GetPreferredAllocation failed: {code}: {details}", code
            ) from error
        if len(response.container_responses) != 1:
            raise AllocationError(
                f"GetPreferredAllocation returned {len(response.container_responses)} container "
                "responses for 1 container request"
            )
        ids = tuple(response.container_responses[0].deviceIDs)
        problems = []
        if len(ids) != size:
            problems.append(f"{len(ids)} devices instead of {size}")
        if len(set(ids)) != len(ids):
            problems.append("duplicate ids")
        if not set(ids) <= set(available):
            problems.append(f"ids outside the available set: {sorted(set(ids) - set(available))}")
        if not set(must) <= set(ids):
            problems.append(f"must-include ids missing: {sorted(set(must) - set(ids))}")
        if problems:
            raise AllocationError(
                f"invalid GetPreferredAllocation answer {list(ids)}: " + "; ".join(problems)
            )
        return ids

    def _call_allocate(self, endpoint: _Endpoint, device_ids: Sequence[str]) -> ContainerResponse:
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=list(device_ids))]
        )
        try:
            response = endpoint.stub.Allocate(request, timeout=self._rpc_timeout_s)
        except grpc.RpcError as error:
            code, details = _rpc_error_text(error)
            raise AllocationError(f"Allocate failed: {code}: {details}", code) from error
        if not response.container_responses:
            raise AllocationError("no containers return in allocation response")
        # The kubelet reads only the first container response.
        return container_response_from_wire(response.container_responses[0])

    def _call_pre_start(self, endpoint: _Endpoint, device_ids: Sequence[str]) -> None:
        request = dp.PreStartContainerRequest(devices_ids=list(device_ids))
        try:
            endpoint.stub.PreStartContainer(request, timeout=PRE_START_CONTAINER_TIMEOUT_S)
        except grpc.RpcError as error:
            code, details = _rpc_error_text(error)
            raise AllocationError(f"PreStartContainer failed: {code}: {details}", code) from error

    def allocate_raw(self, resource: str, device_ids: Iterable[str]) -> ContainerResponse:
        """Send one Allocate with exactly ``device_ids`` (unknown ones too); nothing is recorded."""
        return self._call_allocate(self._current_endpoint(resource), list(device_ids))

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
                self._call_pre_start(endpoint, allocation.device_ids)
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
