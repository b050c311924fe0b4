"""The exporter's PodResources client against the kubelet emulator's server on a real unix
socket: the kubelet's one-ID-per-entry layout, and a kubelet restart."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubegpu.core.metrics import DeviceAssignment, PodKey
from kubegpu.kubelet.pod_resources import KubeletPodResources
from kubegpu.testing.kubelet import Allocation, ContainerResponse, SeenDevice
from kubegpu.testing.podresources import TokenBucket, serve_pod_resources

RESOURCE = "nvidia.com/gpu"
EMPTY = ContainerResponse(envs={}, mounts=(), devices=(), annotations={}, cdi_devices=())


class Kubelet:
    def __init__(self, allocations: list[Allocation]) -> None:
        self._allocations = allocations

    def allocations(self) -> list[Allocation]:
        return self._allocations

    def resources(self) -> list[str]:
        return [RESOURCE]

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        return {}


def allocation(
    pod: str, container: str, ids: tuple[str, ...], **numa: tuple[int, ...]
) -> Allocation:
    return Allocation(
        pod_uid=f"uid-{pod}",
        pod_name=pod,
        namespace="ml",
        container=container,
        resource_name=RESOURCE,
        device_ids=ids,
        response=EMPTY,
        preferred_device_ids=None,
        pre_start_called=True,
        numa_nodes={i: numa.get(i.replace("-", "_"), ()) for i in ids},
    )


@pytest.fixture
def sock() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kgp-", dir="/tmp") as d:
        yield Path(d) / "kubelet.sock"


def test_lists_every_device_id_once_per_container(sock: Path) -> None:
    kubelet = Kubelet(
        [
            allocation("a", "main", ("GPU-1", "GPU-2"), GPU_1=(0, 1)),  # two NUMA entries
            allocation("a", "sidecar", ("GPU-3",)),
            allocation("b", "main", ("GPU-4::0",)),
        ]
    )
    server = serve_pod_resources(kubelet, sock)  # type: ignore[arg-type]
    client = KubeletPodResources(sock)
    try:
        found = client.list_assignments()
    finally:
        client.close()
        server.stop(None)
    a, b = PodKey("ml", "a"), PodKey("ml", "b")
    assert sorted(found, key=lambda x: (x.pod, x.container, x.device_id)) == [
        DeviceAssignment(a, "main", RESOURCE, "GPU-1"),
        DeviceAssignment(a, "main", RESOURCE, "GPU-2"),
        DeviceAssignment(a, "sidecar", RESOURCE, "GPU-3"),
        DeviceAssignment(b, "main", RESOURCE, "GPU-4::0"),
    ]


def test_reads_again_right_after_the_kubelet_recreates_its_socket(sock: Path) -> None:
    kubelet = Kubelet([allocation("a", "main", ("GPU-1",))])
    server = serve_pod_resources(kubelet, sock)  # type: ignore[arg-type]
    client = KubeletPodResources(sock, timeout_s=5)
    try:
        assert len(client.list_assignments()) == 1
        server.stop(None).wait()
        with pytest.raises(grpc.RpcError):
            client.list_assignments()
        sock.unlink(missing_ok=True)
        server = serve_pod_resources(kubelet, sock)  # type: ignore[arg-type]
        assert len(client.list_assignments()) == 1
    finally:
        client.close()
        server.stop(None)


def test_rate_limit_rejection_is_an_error_the_refresher_counts(sock: Path) -> None:
    server = serve_pod_resources(
        Kubelet([]),
        sock,
        TokenBucket(qps=0.001, burst=1),  # type: ignore[arg-type]
    )
    client = KubeletPodResources(sock)
    try:
        client.list_assignments()
        with pytest.raises(grpc.RpcError) as info:
            client.list_assignments()
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        client.close()
        server.stop(None)
