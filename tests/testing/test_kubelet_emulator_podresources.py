"""PodResources v1 served by the kubelet emulator, read with the generated client stub."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kubegpu.kubelet.api.podresources.v1 import api_pb2 as pr
from kubegpu.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from kubegpu.testing.kubelet import (
    Allocation,
    AllocationError,
    ContainerResponse,
    KubeletEmulator,
    SeenDevice,
)
from kubegpu.testing.podresources import TokenBucket, serve_pod_resources
from tests.testing.kubelet_plugin_double import FakeDevice, PluginDouble

RESOURCE = "example.com/gpu"
# gpu-0/1 on NUMA 0, gpu-2 spans NUMA 0 and 1, gpu-3 has no topology.
DEVICES = [
    FakeDevice("gpu-0", numa=(0,)),
    FakeDevice("gpu-1", numa=(0,)),
    FakeDevice("gpu-2", numa=(0, 1)),
    FakeDevice("gpu-3"),
]


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kg-podres-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(workdir: Path) -> Iterator[KubeletEmulator]:
    emulator = KubeletEmulator(
        workdir / "device-plugins",
        pod_resources_socket=workdir / "pod-resources" / "kubelet.sock",
    )
    with emulator:
        plugin = PluginDouble(emulator.plugin_dir, DEVICES, preferred=False).serve()
        plugin.register()
        emulator.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout_s=5)
        yield emulator
        plugin.stop()


@pytest.fixture
def lister(kubelet: KubeletEmulator) -> Iterator[pr_grpc.PodResourcesListerStub]:
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        yield pr_grpc.PodResourcesListerStub(channel)


def device_entries(container: pr.ContainerResources) -> list[tuple[str, list[str], list[int]]]:
    return [
        (d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes])
        for d in container.devices
    ]


def test_list_reports_one_entry_per_device_and_numa_node(
    kubelet: KubeletEmulator, lister: pr_grpc.PodResourcesListerStub
) -> None:
    kubelet.allocate(RESOURCE, 2, pod_uid="u1", pod_name="train", namespace="ml", container="a")
    kubelet.allocate(RESOURCE, 2, pod_uid="u1", pod_name="train", namespace="ml", container="b")

    (pod,) = lister.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources

    assert (pod.name, pod.namespace) == ("train", "ml")
    assert [c.name for c in pod.containers] == ["a", "b"]
    assert device_entries(pod.containers[0]) == [
        (RESOURCE, ["gpu-0"], [0]),
        (RESOURCE, ["gpu-1"], [0]),
    ]
    # gpu-2 spans two NUMA nodes -> two entries; gpu-3 has none -> one entry, no topology.
    assert device_entries(pod.containers[1]) == [
        (RESOURCE, ["gpu-2"], [0]),
        (RESOURCE, ["gpu-2"], [1]),
        (RESOURCE, ["gpu-3"], []),
    ]
    assert not pod.containers[1].devices[2].HasField("topology")


def test_regular_init_containers_are_left_out_and_sidecars_listed_first(
    kubelet: KubeletEmulator, lister: pr_grpc.PodResourcesListerStub
) -> None:
    # The kubelet's order: init containers (the sidecar among them), then app containers; the
    # app container reuses the device the regular init container had.
    ids = {"pod_uid": "u1", "pod_name": "train", "namespace": "ml"}
    init = kubelet.allocate(RESOURCE, 1, container="setup", kind="init", **ids)
    kubelet.allocate(RESOURCE, 1, container="proxy", kind="sidecar", **ids)
    kubelet.allocate(RESOURCE, 1, container="main", must_include=init.device_ids, **ids)
    # A pod whose only device-holding container is a regular init container.
    kubelet.allocate(
        RESOURCE, 1, pod_uid="u2", pod_name="prep", namespace="ml", container="fetch", kind="init"
    )

    listed = lister.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources
    assert [(p.name, [c.name for c in p.containers]) for p in listed] == [
        ("train", ["proxy", "main"]),
        ("prep", []),
    ]
    train = listed[0]
    assert device_entries(train.containers[0]) == [(RESOURCE, ["gpu-1"], [0])]
    assert device_entries(train.containers[1]) == [(RESOURCE, ["gpu-0"], [0])]
    got = lister.Get(pr.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"), timeout=5)
    assert got.pod_resources == train
    got = lister.Get(pr.GetPodResourcesRequest(pod_name="prep", pod_namespace="ml"), timeout=5)
    assert (got.pod_resources.name, list(got.pod_resources.containers)) == ("prep", [])
    # The init containers' devices are still the pods': the kubelet hands them to nobody else.
    assert {d for a in kubelet.allocations() for d in a.device_ids} == {"gpu-0", "gpu-1", "gpu-2"}
    with pytest.raises(AllocationError, match="belongs to another pod"):
        kubelet.allocate(RESOURCE, 1, pod_uid="u3", must_include=["gpu-2"])


def test_released_pods_leave_the_list(
    kubelet: KubeletEmulator, lister: pr_grpc.PodResourcesListerStub
) -> None:
    kubelet.allocate(RESOURCE, 1, pod_uid="u1", pod_name="one")
    kubelet.allocate(RESOURCE, 1, pod_uid="u2", pod_name="two")
    kubelet.release("u1")
    listed = lister.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources
    assert [p.name for p in listed] == ["two"]


def test_get_finds_a_pod_by_namespace_and_name(
    kubelet: KubeletEmulator, lister: pr_grpc.PodResourcesListerStub
) -> None:
    kubelet.allocate(RESOURCE, 1, pod_uid="u1", pod_name="train", namespace="ml")
    response = lister.Get(pr.GetPodResourcesRequest(pod_name="train", pod_namespace="ml"))
    assert response.pod_resources.name == "train"
    assert device_entries(response.pod_resources.containers[0]) == [(RESOURCE, ["gpu-0"], [0])]

    with pytest.raises(grpc.RpcError) as caught:
        lister.Get(pr.GetPodResourcesRequest(pod_name="train", pod_namespace="default"))
    assert caught.value.details() == "pod train in namespace default not found"


def test_allocatable_lists_healthy_devices_including_allocated_ones(
    kubelet: KubeletEmulator, lister: pr_grpc.PodResourcesListerStub
) -> None:
    kubelet.allocate(RESOURCE, 1, pod_uid="u1")
    response = lister.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=5)
    ids = sorted({i for d in response.devices for i in d.device_ids})
    assert ids == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all(len(d.device_ids) == 1 for d in response.devices)


def test_allocatable_leaves_out_unhealthy_devices(workdir: Path) -> None:
    socket = workdir / "pr.sock"
    with KubeletEmulator(workdir / "dp", pod_resources_socket=socket) as kubelet:
        plugin = PluginDouble(
            kubelet.plugin_dir, [FakeDevice("ok"), FakeDevice("bad", healthy=False)]
        ).serve()
        try:
            plugin.register()
            kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 2, timeout_s=5)
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                response = pr_grpc.PodResourcesListerStub(channel).GetAllocatableResources(
                    pr.AllocatableResourcesRequest(), timeout=5
                )
            assert [list(d.device_ids) for d in response.devices] == [["ok"]]
        finally:
            plugin.stop()


class _FrozenClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_allows_a_burst_of_ten_then_refills_at_one_hundred_per_second() -> None:
    clock = _FrozenClock()
    bucket = TokenBucket(clock=clock)
    assert [bucket.allow() for _ in range(11)] == [True] * 10 + [False]
    clock.now += 0.0625  # 6.25 tokens at 100/s (a binary-exact step)
    assert [bucket.allow() for _ in range(7)] == [True] * 6 + [False]
    clock.now += 60.0  # refills only up to the burst
    assert sum(bucket.allow() for _ in range(20)) == 10


class _OnePod:
    def allocations(self) -> list[Allocation]:
        response = ContainerResponse({}, (), (), {}, ())
        return [Allocation("u", "p", "ns", "c", RESOURCE, ("g",), response, None, False)]

    def resources(self) -> list[str]:
        return [RESOURCE]

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        return {"g": SeenDevice("g", "Healthy")}


def test_calls_over_the_rate_limit_get_resource_exhausted(workdir: Path) -> None:
    socket = workdir / "limited.sock"
    server = serve_pod_resources(_OnePod(), socket, TokenBucket(clock=_FrozenClock()))
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = pr_grpc.PodResourcesListerStub(channel)
            for _ in range(10):
                stub.List(pr.ListPodResourcesRequest(), timeout=5)
            with pytest.raises(grpc.RpcError) as caught:
                stub.List(pr.ListPodResourcesRequest(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.details() == "rejected by rate limit"
    finally:
        server.stop(grace=None).wait()


def test_kubelet_restart_recreates_the_pod_resources_socket_and_keeps_assignments(
    kubelet: KubeletEmulator,
) -> None:
    kubelet.allocate(RESOURCE, 1, pod_uid="u1", pod_name="kept")
    kubelet.restart()
    assert kubelet.pod_resources_socket is not None
    assert kubelet.pod_resources_socket.is_socket()
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        listed = pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=5
        )
    assert [p.name for p in listed.pod_resources] == ["kept"]
