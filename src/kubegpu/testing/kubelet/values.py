"""The kubelet emulator's vocabulary: protocol constants, Register's name rules, errors, values.

The constants of device plugin API v1beta1 as the kubelet uses them, the extended-resource-name
check ``Register`` applies (apimachinery's rules), the emulator's errors, and the frozen
dataclasses callers get instead of wire messages: registrations, devices as last seen, device
list updates, Allocate answers and allocations. Separate so that tests, the PodResources server
and the exporter's tests read these values without the gRPC machinery of the emulator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

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
