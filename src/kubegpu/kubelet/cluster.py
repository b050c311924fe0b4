"""The node agent's two outside views of its pods: the API server and the kubelet.

* :class:`NodeApi` — this node's pods (field selector ``spec.nodeName``: a list with its
  resourceVersion, and a watch from one), annotation patches on them, and the node's GPU
  inventory and MIG devices annotations. A port: the real one is
  :class:`kubegpu.kube.agent_api.LightkubeNodeApi` (lightkube, async), wired by
  :mod:`kubegpu.roles.node_agent`; tests run it against the fake API server over HTTP.
* :class:`PodResourcesApi` — which container holds which device id, from the kubelet's
  PodResources v1 ``List`` over its unix socket; :class:`KubeletPodResourcesApi` is the real
  one (grpc.aio). The kubelet emulator serves the same API in tests.

Wire types stop here: callers get pod JSON dicts and :class:`DeviceHolding` values.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kubegpu.core.apiserver import ConflictError, PodListing
from kubegpu.core.gpu import GpuDevice, NodeInventory
from kubegpu.kubelet.api.podresources.v1 import api_pb2, api_pb2_grpc
from kubegpu.sharing.annotations import (
    GpuRecord,
    MigCardRecord,
    MigDeviceRecord,
    NodeGpuInventory,
    NodeMigDevices,
)
from kubegpu.unix_channels import unix_aio_channel

log = logging.getLogger(__name__)

__all__ = [
    "ConflictError",
    "DeviceHolding",
    "KubeletPodResourcesApi",
    "NodeApi",
    "PodListing",
    "PodResourcesApi",
    "holdings_from_list",
    "inventory_records",
    "mig_records",
]


class NodeApi(Protocol):
    async def list_node_pods(self) -> PodListing: ...

    def watch_node_pods(
        self, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Events (``ADDED``, ``MODIFIED``, ``DELETED``, ``BOOKMARK``) after
        ``resource_version``, re-opened when the server ends a stream; raises on errors, an
        ``ApiError`` with code 410 when that version is too old to resume from."""
        ...

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> None:
        """Merge ``annotations`` (None deletes a key); raises :class:`ConflictError` on 409."""
        ...

    async def publish_inventory(self, inventory: NodeGpuInventory) -> bool: ...

    async def publish_mig_devices(self, devices: NodeMigDevices | None) -> bool:
        """Make the node's MIG devices annotation say ``devices`` (None removes it)."""
        ...


def inventory_records(
    inventory: NodeInventory, unhealthy: Collection[str] = ()
) -> NodeGpuInventory:
    """The published form of the agent's inventory snapshot; ``unhealthy`` holds GPU UUIDs
    the health monitor has marked unusable."""
    bad = {str(u) for u in unhealthy}
    return NodeGpuInventory(
        tuple(
            GpuRecord(
                uuid=str(gpu.uuid),
                index=gpu.index,
                model=gpu.product_name,
                memory_mib=gpu.memory_total_mib,
                healthy=str(gpu.uuid) not in bad,
            )
            for gpu in sorted(inventory.gpus, key=lambda g: g.index)
        )
    )


def mig_records(
    gpus: Iterable[GpuDevice],
    unhealthy: Collection[str] = (),
    resources: Mapping[str, str] | None = None,
) -> NodeMigDevices | None:
    """The published form of the cards served by their MIG devices (``gpus``: those the
    inventory leaves out), None when there are none. ``resources`` maps a MIG UUID to the
    resource it is advertised under; a MIG device is unhealthy when it or its card is."""
    bad = {str(u) for u in unhealthy}
    named = resources or {}
    cards = tuple(
        MigCardRecord(
            uuid=str(gpu.uuid),
            index=gpu.index,
            model=gpu.product_name,
            memory_mib=gpu.memory_total_mib,
            healthy=str(gpu.uuid) not in bad,
            devices=tuple(
                MigDeviceRecord(
                    uuid=mig.uuid,
                    profile=mig.profile,
                    start=mig.start,
                    slices=mig.memory_slices,
                    memory_mib=mig.memory_total_mib,
                    gpu_instance_id=mig.gpu_instance_id,
                    resource=named.get(mig.uuid, ""),
                    healthy=str(gpu.uuid) not in bad and mig.uuid not in bad,
                )
                for mig in sorted(gpu.mig_devices, key=lambda m: (m.start, m.gpu_instance_id))
            ),
        )
        for gpu in sorted(gpus, key=lambda g: g.index)
    )
    return NodeMigDevices(cards) if cards else None


@dataclass(frozen=True)
class DeviceHolding:
    """One container's device ids of one resource, as the kubelet reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesApi(Protocol):
    async def list_holdings(self) -> list[DeviceHolding]: ...


class KubeletPodResourcesApi:
    """PodResources v1 ``List``; a fresh channel per call, because the kubelet re-creates its
    socket when it restarts and a channel that saw it fail backs off for minutes."""

    def __init__(self, socket_path: Path, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    async def list_holdings(self) -> list[DeviceHolding]:
        async with unix_aio_channel(self.socket_path) as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        return holdings_from_list(response)


def holdings_from_list(response: api_pb2.ListPodResourcesResponse) -> list[DeviceHolding]:
    # One entry per (device, NUMA node) in current kubelets: group by resource, dedupe ids.
    out: list[DeviceHolding] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            by_resource: dict[str, list[str]] = {}
            for entry in container.devices:
                ids = by_resource.setdefault(entry.resource_name, [])
                ids.extend(i for i in entry.device_ids if i not in ids)
            for resource, ids in by_resource.items():
                out.append(
                    DeviceHolding(pod.namespace, pod.name, container.name, resource, tuple(ids))
                )
    return out
