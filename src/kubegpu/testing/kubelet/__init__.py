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
test instead of hanging it. Wire messages never leave this package: callers get frozen
dataclasses.

The pieces: :mod:`~kubegpu.testing.kubelet.values` (constants, name rules, errors, the values
callers get), :mod:`~kubegpu.testing.kubelet.plugin_client` (dialing a plugin and each RPC),
:mod:`~kubegpu.testing.kubelet.records` (what was seen and decided, and the queries on it) and
:mod:`~kubegpu.testing.kubelet.emulator` (:class:`KubeletEmulator` itself). This module
re-exports the public names.
"""

from kubegpu.testing.kubelet.emulator import KubeletEmulator
from kubegpu.testing.kubelet.plugin_client import (
    container_response_from_wire,
    device_state_from_wire,
    remove_sockets,
)
from kubegpu.testing.kubelet.values import (
    API_VERSION,
    CHECKPOINT_NAME,
    HEALTHY,
    KUBELET_SOCKET_NAME,
    MAX_UNIX_SOCKET_PATH_BYTES,
    PLUGIN_DIAL_TIMEOUT_S,
    PRE_START_CONTAINER_TIMEOUT_S,
    SUPPORTED_VERSIONS,
    UNHEALTHY,
    Allocation,
    AllocationError,
    ContainerKind,
    ContainerResponse,
    DeviceNodeSpec,
    DeviceUpdate,
    KubeletEmulatorError,
    MountSpec,
    Registration,
    RejectedRegistration,
    SeenDevice,
    UpdateSource,
    is_extended_resource_name,
    is_qualified_name,
)

__all__ = [
    "API_VERSION",
    "CHECKPOINT_NAME",
    "HEALTHY",
    "KUBELET_SOCKET_NAME",
    "MAX_UNIX_SOCKET_PATH_BYTES",
    "PLUGIN_DIAL_TIMEOUT_S",
    "PRE_START_CONTAINER_TIMEOUT_S",
    "SUPPORTED_VERSIONS",
    "UNHEALTHY",
    "Allocation",
    "AllocationError",
    "ContainerKind",
    "ContainerResponse",
    "DeviceNodeSpec",
    "DeviceUpdate",
    "KubeletEmulator",
    "KubeletEmulatorError",
    "MountSpec",
    "Registration",
    "RejectedRegistration",
    "SeenDevice",
    "UpdateSource",
    "container_response_from_wire",
    "device_state_from_wire",
    "is_extended_resource_name",
    "is_qualified_name",
    "remove_sockets",
]
