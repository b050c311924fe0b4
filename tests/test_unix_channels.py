"""Clients of re-created unix sockets reach the new socket at once (kubegpu.unix_channels).

gRPC shares subchannels process-wide by default: a fresh channel to a socket that was just
re-created would inherit the old subchannel's reconnect backoff and fail with "No such file or
directory" for up to minutes. This drives the sharing coordinator's PodResources client
across real socket re-creations, several times over, against a real gRPC server (the exporter's
client: tests/exporter/test_podresources_client.py; registration: the kubelet-restart tests).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubegpu.kubelet.cluster import DeviceHolding, KubeletPodResourcesApi
from kubegpu.testing.kubelet import Allocation, ContainerResponse, SeenDevice
from kubegpu.testing.podresources import serve_pod_resources
from tests.kubelet.conftest import RESOURCE, short_tempdir

RESTARTS = 5
EMPTY = ContainerResponse(envs={}, mounts=(), devices=(), annotations={}, cdi_devices=())


class OnePodKubelet:
    def allocations(self) -> list[Allocation]:
        return [
            Allocation(
                pod_uid="uid-a",
                pod_name="a",
                namespace="ml",
                container="main",
                resource_name=RESOURCE,
                device_ids=("GPU-1",),
                response=EMPTY,
                preferred_device_ids=None,
                pre_start_called=True,
                numa_nodes={"GPU-1": ()},
            )
        ]

    def resources(self) -> list[str]:
        return [RESOURCE]

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        return {}


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_pod_resources_answers_right_after_each_kubelet_restart(root: Path) -> None:
    sock = root / "kubelet.sock"
    api = KubeletPodResourcesApi(sock, timeout_s=5)
    expected = [DeviceHolding("ml", "a", "main", RESOURCE, ("GPU-1",))]
    for _ in range(RESTARTS):
        server = serve_pod_resources(OnePodKubelet(), sock)  # type: ignore[arg-type]
        try:
            assert await api.list_holdings() == expected
        finally:
            server.stop(None).wait()
        assert not sock.exists()  # the server removed its socket, as the kubelet's restart does
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await api.list_holdings()
        assert gone.value.code() is grpc.StatusCode.UNAVAILABLE
