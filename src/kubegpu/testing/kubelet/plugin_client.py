"""The kubelet's side of the wire toward one device plugin: dialing it and every RPC it makes.

Dialing the plugin's unix socket, GetPreferredAllocation (answer validated strictly),
Allocate and PreStartContainer, the translation of their wire messages into the values of
:mod:`kubegpu.testing.kubelet.values`, the state of one plugin connection
(:class:`PluginEndpoint`), and the socket housekeeping of the plugin directory. Separate from the
emulator, which decides *when* to call and records what it learned: here is only *how*.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from kubegpu.testing.kubelet.values import (
    CHECKPOINT_NAME,
    MAX_UNIX_SOCKET_PATH_BYTES,
    PRE_START_CONTAINER_TIMEOUT_S,
    AllocationError,
    ContainerResponse,
    DeviceNodeSpec,
    KubeletEmulatorError,
    MountSpec,
    Registration,
    SeenDevice,
)
from kubegpu.testing.waiting import wait_until
from kubegpu.unix_channels import unix_channel


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


def check_unix_path(path: Path) -> None:
    if len(os.fsencode(str(path))) > MAX_UNIX_SOCKET_PATH_BYTES:
        raise KubeletEmulatorError(
            f"unix socket path {path} is longer than {MAX_UNIX_SOCKET_PATH_BYTES} bytes; "
            "use a shorter directory"
        )


def is_socket(path: Path) -> bool:
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
        if entry.name != CHECKPOINT_NAME and is_socket(entry):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def rpc_error_text(error: grpc.RpcError) -> tuple[str, str]:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return (code.name if code is not None else "UNKNOWN", str(details))


@dataclass
class PluginEndpoint:
    """Mutable kubelet-side state of one plugin connection (one registration)."""

    registration: Registration
    channel: grpc.Channel
    stub: dp_grpc.DevicePluginStub
    closing: bool = False
    stopped: bool = False
    call: Any = None
    thread: threading.Thread | None = None


def dial_plugin(socket_path: Path, timeout_s: float) -> grpc.Channel:
    """A channel to the plugin's socket, ready, or ``KubeletEmulatorError`` within ``timeout_s``."""
    # The kubelet's dial blocks up to 10 s; waiting for the file first keeps the common
    # failure (no socket) from burning gRPC's reconnect backoff.
    deadline = time.monotonic() + timeout_s
    try:
        # The plugin may be another process: nothing announces its socket but the file.
        wait_until(
            lambda: is_socket(socket_path),
            timeout_s=timeout_s,
            what=f"unix socket at {socket_path}",
            poll_s=0.01,
        )
    except TimeoutError:
        raise KubeletEmulatorError(f"no unix socket at {socket_path}") from None
    check_unix_path(socket_path)
    channel = unix_channel(socket_path, ("grpc.default_authority", "localhost"))
    try:
        grpc.channel_ready_future(channel).result(timeout=max(0.0, deadline - time.monotonic()))
    except grpc.FutureTimeoutError as error:
        channel.close()
        raise KubeletEmulatorError(f"context deadline exceeded dialing {socket_path}") from error
    return channel


def get_preferred_allocation(
    stub: dp_grpc.DevicePluginStub,
    available: list[str],
    must: list[str],
    size: int,
    timeout_s: float,
) -> tuple[str, ...]:
    """GetPreferredAllocation for one container, its answer validated strictly (the kubelet
    silently intersects and fills up; a test should see the plugin's mistake)."""
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
        response = stub.GetPreferredAllocation(request, timeout=timeout_s)
    except grpc.RpcError as error:
        code, details = rpc_error_text(error)
        raise AllocationError(f"GetPreferredAllocation failed: {code}: {details}", code) from error
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


def allocate_devices(
    stub: dp_grpc.DevicePluginStub, device_ids: Sequence[str], timeout_s: float
) -> ContainerResponse:
    """Allocate with one container request; the first container response, as our value."""
    request = dp.AllocateRequest(
        container_requests=[dp.ContainerAllocateRequest(devices_ids=list(device_ids))]
    )
    try:
        response = stub.Allocate(request, timeout=timeout_s)
    except grpc.RpcError as error:
        code, details = rpc_error_text(error)
        raise AllocationError(f"Allocate failed: {code}: {details}", code) from error
    if not response.container_responses:
        raise AllocationError("no containers return in allocation response")
    # The kubelet reads only the first container response.
    return container_response_from_wire(response.container_responses[0])


def pre_start_container(stub: dp_grpc.DevicePluginStub, device_ids: Sequence[str]) -> None:
    """PreStartContainer, under the kubelet's own deadline for it."""
    request = dp.PreStartContainerRequest(devices_ids=list(device_ids))
    try:
        stub.PreStartContainer(request, timeout=PRE_START_CONTAINER_TIMEOUT_S)
    except grpc.RpcError as error:
        code, details = rpc_error_text(error)
        raise AllocationError(f"PreStartContainer failed: {code}: {details}", code) from error
