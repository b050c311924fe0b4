"""The kubelet's PodResources v1 API (``v1.PodResourcesLister``) for the kubelet emulator.

What it owns: turning the emulator's allocations and device lists into List / Get /
GetAllocatableResources answers with the kubelet's real shape (fact sheet section 2.3): per pod
its sidecars (restartable init containers) first, then its app containers, and never its regular
init containers, although the devices they were given stay the pod's (and the kubelet hands
them on to the pod's later containers); one ``ContainerDevices`` entry per (device, NUMA node),
a device without topology as one entry without topology; only pods that still hold devices; and
the kubelet's 100 req/s (burst 10) rate limit answered with RESOURCE_EXHAUSTED. Consumers
(exporter, plugin) talk to it through the generated stub exactly as they would to a kubelet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Protocol

import grpc

from kubegpu.kubelet.api.podresources.v1 import api_pb2 as pr
from kubegpu.kubelet.api.podresources.v1 import api_pb2_grpc as pr_grpc
from kubegpu.testing.kubelet import Allocation, SeenDevice

# pkg/kubelet/apis/podresources/grpc/ratelimit.go
DEFAULT_QPS = 100.0
DEFAULT_BURST = 10


class PodResourcesSource(Protocol):
    """What the servicer reads: the emulator's allocations and current device lists."""

    def allocations(self) -> list[Allocation]: ...

    def resources(self) -> list[str]: ...

    def devices(self, resource: str) -> dict[str, SeenDevice]: ...


class TokenBucket:
    """The kubelet's shared rate limiter (golang.org/x/time/rate semantics), clock injected."""

    def __init__(
        self,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._qps = qps
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


def container_devices(
    resource: str, device_ids: Iterable[str], numa_nodes: Mapping[str, tuple[int, ...]]
) -> list[pr.ContainerDevices]:
    """One entry per (device, NUMA node), as the kubelet builds them; no NUMA -> no topology."""
    entries: list[pr.ContainerDevices] = []
    for device_id in device_ids:
        nodes = numa_nodes.get(device_id, ())
        if not nodes:
            entries.append(pr.ContainerDevices(resource_name=resource, device_ids=[device_id]))
        for node in nodes:
            entries.append(
                pr.ContainerDevices(
                    resource_name=resource,
                    device_ids=[device_id],
                    topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]),
                )
            )
    return entries


def pod_resources(allocations: list[Allocation]) -> list[pr.PodResources]:
    """Group allocations into pods (first-allocated pod first) and containers: per pod the
    sidecars, then the app containers, each in allocation order; regular init containers are
    left out (a pod whose devices only they hold is listed without containers: the kubelet
    knows it, and lists every active pod)."""
    pods: dict[str, pr.PodResources] = {}
    for allocation in allocations:
        if allocation.pod_uid not in pods:
            pods[allocation.pod_uid] = pr.PodResources(
                name=allocation.pod_name, namespace=allocation.namespace
            )
    containers: dict[tuple[str, str], pr.ContainerResources] = {}
    sidecars_first = sorted(allocations, key=lambda a: a.kind != "sidecar")  # stable
    for allocation in sidecars_first:
        if allocation.kind == "init":
            continue
        pod = pods[allocation.pod_uid]
        key = (allocation.pod_uid, allocation.container)
        container = containers.get(key)
        if container is None:
            container = pod.containers.add(name=allocation.container)
            containers[key] = container
        container.devices.extend(
            container_devices(
                allocation.resource_name, allocation.device_ids, allocation.numa_nodes
            )
        )
    return list(pods.values())


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    def __init__(self, source: PodResourcesSource, limiter: TokenBucket | None = None) -> None:
        self._source = source
        self._limiter = limiter if limiter is not None else TokenBucket()

    def _admit(self, context: grpc.ServicerContext) -> None:
        if not self._limiter.allow():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        self._admit(context)
        return pr.ListPodResourcesResponse(pod_resources=pod_resources(self._source.allocations()))

    def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pr.GetPodResourcesResponse:
        self._admit(context)
        mine = [
            a
            for a in self._source.allocations()
            if (a.pod_name, a.namespace) == (request.pod_name, request.pod_namespace)
        ]
        if not mine:
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        return pr.GetPodResourcesResponse(pod_resources=pod_resources(mine)[0])

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._admit(context)
        response = pr.AllocatableResourcesResponse()
        for resource in self._source.resources():
            healthy = {d: s for d, s in self._source.devices(resource).items() if s.healthy}
            numa = {d: s.numa_nodes for d, s in healthy.items()}
            response.devices.extend(container_devices(resource, sorted(healthy), numa))
        return response


def serve_pod_resources(
    source: PodResourcesSource, socket_path: Path, limiter: TokenBucket | None = None
) -> grpc.Server:
    """Start a PodResources server on ``socket_path``; the caller stops it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="podres"))
    pr_grpc.add_PodResourcesListerServicer_to_server(PodResourcesServicer(source, limiter), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server
