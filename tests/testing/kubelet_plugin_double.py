"""A tiny scriptable device plugin built on the generated stubs, to drive the kubelet emulator.

The real plugin is another package's job; this double only does what the emulator's tests need:
serve ``v1beta1.DevicePlugin`` on its own socket, register, push device lists and record every
call with its request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from kubegpu.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc


@dataclass(frozen=True)
class FakeDevice:
    id: str
    healthy: bool = True
    numa: tuple[int, ...] = ()

    def to_wire(self) -> dp.Device:
        device = dp.Device(ID=self.id, health="Healthy" if self.healthy else "Unhealthy")
        if self.numa:
            device.topology.nodes.extend(dp.NUMANode(ID=n) for n in self.numa)
        return device


def last_ids(request: dp.ContainerPreferredAllocationRequest) -> list[str]:
    """Default preference: must-include ids, then the highest available ids.

    Deliberately not what the emulator picks on its own (lowest first), so tests can tell
    that the answer was used.
    """
    must = list(request.must_include_deviceIDs)
    rest = sorted(set(request.available_deviceIDs) - set(must), reverse=True)
    return must + rest[: request.allocation_size - len(must)]


class PluginDouble(dp_grpc.DevicePluginServicer):
    def __init__(
        self,
        plugin_dir: Path,
        devices: Sequence[FakeDevice],
        *,
        resource: str = "example.com/gpu",
        socket_name: str = "double.sock",
        preferred: bool = True,
        pre_start: bool = False,
        prefer: Callable[[dp.ContainerPreferredAllocationRequest], list[str]] = last_ids,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.socket_name = socket_name
        self.preferred = preferred
        self.pre_start = pre_start
        self.prefer = prefer
        self.calls: list[tuple[str, Any]] = []
        self._devices = list(devices)
        self._generation = 0
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    def call_names(self) -> list[str]:
        with self._cond:
            return [name for name, _ in self.calls]

    def _record(self, name: str, request: Any) -> None:
        with self._cond:
            self.calls.append((name, request))

    # -- lifecycle
    def serve(self) -> PluginDouble:
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dp_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        with self._cond:
            self._cond.notify_all()

    def register(self, *, version: str = "v1beta1", resource: str | None = None) -> None:
        """Call Register on kubelet.sock; raises grpc.RpcError when the kubelet refuses."""
        target = f"unix://{self.plugin_dir / 'kubelet.sock'}"
        with grpc.insecure_channel(target) as channel:
            dp_grpc.RegistrationStub(channel).Register(
                dp.RegisterRequest(
                    version=version,
                    endpoint=self.socket_name,
                    resource_name=resource if resource is not None else self.resource,
                    options=dp.DevicePluginOptions(),
                ),
                timeout=15,
            )

    def set_devices(self, devices: Sequence[FakeDevice]) -> None:
        with self._cond:
            self._devices = list(devices)
            self._generation += 1
            self._cond.notify_all()

    # -- DevicePlugin service
    def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> dp.DevicePluginOptions:
        self._record("GetDevicePluginOptions", request)
        return dp.DevicePluginOptions(
            pre_start_required=self.pre_start, get_preferred_allocation_available=self.preferred
        )

    def ListAndWatch(
        self, request: dp.Empty, context: grpc.ServicerContext
    ) -> Iterator[dp.ListAndWatchResponse]:
        self._record("ListAndWatch", request)
        seen = -1
        while context.is_active() and self._server is not None:
            with self._cond:
                if seen == self._generation:
                    self._cond.wait(0.05)
                    continue
                seen = self._generation
                devices = list(self._devices)
            yield dp.ListAndWatchResponse(devices=[d.to_wire() for d in devices])

    def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> dp.PreferredAllocationResponse:
        self._record("GetPreferredAllocation", request)
        return dp.PreferredAllocationResponse(
            container_responses=[
                dp.ContainerPreferredAllocationResponse(deviceIDs=self.prefer(r))
                for r in request.container_requests
            ]
        )

    def Allocate(
        self, request: dp.AllocateRequest, context: grpc.ServicerContext
    ) -> dp.AllocateResponse:
        self._record("Allocate", request)
        with self._cond:
            known = {d.id for d in self._devices}
        response = dp.AllocateResponse()
        for container in request.container_requests:
            unknown = sorted(set(container.devices_ids) - known)
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            ids = ",".join(container.devices_ids)
            response.container_responses.add(
                envs={"FAKE_VISIBLE_DEVICES": ids},
                mounts=[
                    dp.Mount(container_path="/opt/fake", host_path="/opt/fake", read_only=True)
                ],
                devices=[
                    dp.DeviceSpec(
                        container_path=f"/dev/fake{i}", host_path=f"/dev/fake{i}", permissions="rw"
                    )
                    for i in container.devices_ids
                ],
                annotations={"fake.example.com/ids": ids},
                cdi_devices=[
                    dp.CDIDevice(name=f"example.com/gpu={i}") for i in container.devices_ids
                ],
            )
        return response

    def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> dp.PreStartContainerResponse:
        self._record("PreStartContainer", request)
        return dp.PreStartContainerResponse()
