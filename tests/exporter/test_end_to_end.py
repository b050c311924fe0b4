"""The exporter as the node agent runs it, with every neighbour real or speaking the real wire
protocol: the fake GPU backend, the kubelet emulator's PodResources server on a unix socket,
the fake API server holding the pods and their ``kubegpu.io/gpu-allocation`` annotations (the
sharing feature's encoder), a hand-made ``/proc``, and ``/metrics`` over HTTP."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Namespace, Pod

from kubegpu.config.model import GpuShare
from kubegpu.exporter.pods import KubeNodePods, allocation_annotation_shares
from kubegpu.exporter.server import ExporterSettings
from kubegpu.inventory.fake import FakeGpuBackend
from kubegpu.inventory.fake_metrics import FakeMetricsSource
from kubegpu.kube.node_pods import LightkubeNodePods
from kubegpu.kubelet.resources import slot_id
from kubegpu.roles.exporter import start_node_exporter
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    encode_allocation,
)
from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_namespace, make_pod
from kubegpu.testing.kubelet import Allocation, ContainerResponse, SeenDevice
from kubegpu.testing.podresources import serve_pod_resources
from tests.exporter.conftest import GIB, systemd_v2, write_cgroup
from tests.exporter.test_http import fetch, samples, wait_for

MIB = 1024**2
# The share-slot resource as the node agent advertises it (sharing.gpuShare.resourceName).
RESOURCE = GpuShare().resource_name


def shared_annotation(uuid: str, index: int, memory_mib: int, milli: int) -> str:
    card = CardShare(uuid=uuid, index=index, compute_milli=milli, gpu_memory_mib=memory_mib)
    return encode_allocation(
        AllocationDecision(
            node="gpu-a",
            cards=(card,),
            containers=(ContainerAllocation("server", False, (card,)),),
            decided_at="2026-11-22T04:00:00Z",
            policy="binpack",
            shared=True,
        )
    )


class Kubelet:
    def __init__(self, allocations: list[Allocation]) -> None:
        self._allocations = allocations

    def allocations(self) -> list[Allocation]:
        return self._allocations

    def resources(self) -> list[str]:
        return [RESOURCE]

    def devices(self, resource: str) -> dict[str, SeenDevice]:
        return {}


@pytest.fixture
def api() -> Iterator[ServerThread]:
    with FakeApiServer().run_in_thread() as handle:
        yield handle


def test_shared_gpu_pods_are_named_measured_and_flagged_over_share(
    api: ServerThread, tmp_path: Path
) -> None:
    backend = FakeGpuBackend.from_spec("4xT4")
    gpu = backend.snapshot().by_index(1)
    metrics = FakeMetricsSource(backend.snapshot())
    proc = tmp_path / "proc"
    empty = ContainerResponse(envs={}, mounts=(), devices=(), annotations={}, cdi_devices=())
    allocations = []
    processes: dict[int, int | None] = {}
    with api.client() as client:
        client.create(Namespace.from_dict(make_namespace("web")))
        for n, (name, used_gib) in enumerate([("infer-a", 3), ("infer-b", 5)]):
            annotations = {ALLOCATION_ANNOTATION: shared_annotation(gpu.uuid, 1, 4096, 500)}
            pod = client.create(
                Pod.from_dict(make_pod(name, "web", node_name="gpu-a", annotations=annotations))
            )
            uid = pod.metadata.uid
            write_cgroup(proc, 100 + n, systemd_v2(uid))
            processes[100 + n] = used_gib * GIB
            allocations.append(
                Allocation(
                    pod_uid=uid,
                    pod_name=name,
                    namespace="web",
                    container="server",
                    resource_name=RESOURCE,
                    # The agent's own slot ids, <uuid>::slot-<n>, from the module that
                    # advertises them.
                    device_ids=(slot_id(gpu.uuid, n),),
                    response=empty,
                    preferred_device_ids=None,
                    pre_start_called=True,
                )
            )
        metrics.set_processes(gpu.uuid, processes)
        # A pod on another node is none of this exporter's business.
        client.create(Pod.from_dict(make_pod("elsewhere", "web", node_name="gpu-b")))

        with tempfile.TemporaryDirectory(prefix="kge-", dir="/tmp") as d:
            sock = Path(d) / "kubelet.sock"
            kubelet = serve_pod_resources(Kubelet(allocations), sock)  # type: ignore[arg-type]
            pods = KubeNodePods(
                LightkubeNodePods(client), "gpu-a", parse_shares=allocation_annotation_shares
            )
            running = start_node_exporter(
                backend,
                ExporterSettings(node_name="gpu-a", listen_port=0, interval_s=0.2, proc=proc),
                pod_resources_socket=sock,
                pod_directory=pods,
                shares=pods,
                metrics=metrics,
            )
            try:
                wait_for(lambda: running.refresher.latest() is not None)
                values = samples(fetch(running.url + "/metrics")[2])
            finally:
                running.stop()
                kubelet.stop(None)
                backend.close()

    g1 = {"node": "gpu-a", "gpu": "1", "uuid": gpu.uuid, "model": "Tesla T4"}

    def pod(name: str) -> frozenset[tuple[str, str]]:
        return frozenset({**g1, "namespace": "web", "pod": name}.items())

    assert values[("kubegpu_pod_gpu_memory_used_bytes", pod("infer-a"))] == 3 * GIB
    assert values[("kubegpu_pod_gpu_memory_used_bytes", pod("infer-b"))] == 5 * GIB
    assert values[("kubegpu_pod_gpu_memory_share_bytes", pod("infer-b"))] == 4096 * MIB
    assert values[("kubegpu_pod_gpu_over_share", pod("infer-a"))] == 0
    assert values[("kubegpu_pod_gpu_over_share", pod("infer-b"))] == 1
    container = frozenset(
        {**g1, "namespace": "web", "pod": "infer-b", "container": "server"}.items()
    )
    assert values[("kubegpu_pod_gpu_allocated", container)] == 1
    assert values[("kubegpu_gpu_allocated_memory_bytes", frozenset(g1.items()))] == 8192 * MIB
    assert values[("kubegpu_gpu_allocated_compute_ratio", frozenset(g1.items()))] == 1.0
    assert not [k for k in values if ("pod", "elsewhere") in k[1]]
    # Two half-card shares of 4 GiB on one card: what the node has granted on it.
    card = frozenset(g1.items())
    assert values[("kubegpu_gpu_allocated_memory_bytes", card)] == 2 * 4096 * MIB
    assert values[("kubegpu_gpu_allocated_compute_ratio", card)] == 1.0
