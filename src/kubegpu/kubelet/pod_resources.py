"""The kubelet's PodResources v1 ``List``, synchronously, for the exporter's refresher thread.

The exporter edge declares what it needs (:class:`~kubegpu.exporter.pods.PodResourcesSource`);
this is the real one. It lives in the kubelet edge, which owns the API's generated code and the
channels that survive a kubelet restart; :mod:`kubegpu.roles.exporter` hands it over.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kubegpu.core.metrics import DeviceAssignment, PodKey

log = logging.getLogger(__name__)

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


class KubeletPodResources:
    """PodResources v1 ``List`` over the kubelet's unix socket.

    dcgm-exporter's pattern: one ``List`` per refresh with a deadline. The kubelet rate-limits
    this API (100/s, burst 10, shared by every caller on the node), which a refresh every few
    seconds stays far below. The kubelet re-creates its socket on restart; gRPC reconnects to
    the path by itself.
    """

    def __init__(self, socket_path: Path = DEFAULT_POD_RESOURCES_SOCKET, timeout_s: float = 5.0):
        from kubegpu.kubelet.api.podresources.v1 import api_pb2

        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._pb = api_pb2
        self._channel: Any = None
        self._stub: Any = None
        self._connect()

    def _connect(self) -> None:
        from kubegpu.kubelet.api.podresources.v1 import api_pb2_grpc
        from kubegpu.unix_channels import unix_channel

        if self._channel is not None:
            self._channel.close()
        self._channel = unix_channel(self.socket_path)
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list_assignments(self) -> tuple[DeviceAssignment, ...]:
        import grpc

        request = self._pb.ListPodResourcesRequest()
        try:
            response = self._stub.List(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            # The kubelet restarted and re-created its socket. A channel that saw the old one
            # fail backs off exponentially (up to minutes) before reconnecting, so start a
            # fresh one (with subchannels of its own: kubegpu.unix_channels) and try once
            # more now.
            log.info("PodResources at %s unavailable; reconnecting", self.socket_path)
            self._connect()
            response = self._stub.List(request, timeout=self.timeout_s)
        return assignments_from_list_response(response)

    def close(self) -> None:
        self._channel.close()


def assignments_from_list_response(response: Any) -> tuple[DeviceAssignment, ...]:
    """Convert a ``ListPodResourcesResponse`` into our values. The kubelet writes one
    ``ContainerDevices`` entry per device ID (and NUMA node), so entries are flattened, never
    assumed to be one per resource."""
    found: list[DeviceAssignment] = []
    for pod in response.pod_resources:
        key = PodKey(namespace=pod.namespace, name=pod.name)
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    found.append(
                        DeviceAssignment(
                            pod=key,
                            container=container.name,
                            resource_name=devices.resource_name,
                            device_id=device_id,
                        )
                    )
    # The same ID can appear once per NUMA node; keep one.
    return tuple(dict.fromkeys(found))
