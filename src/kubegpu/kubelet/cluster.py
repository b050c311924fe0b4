"""The node agent's two outside views of its pods: the API server and the kubelet.

* :class:`NodeApi` — this node's pods (field selector ``spec.nodeName``: a list with its
  resourceVersion, and a watch from one), annotation patches on them, and the node's GPU
  inventory annotation; :class:`LightkubeNodeApi` is the real one (lightkube, async). Tests run
  it against the fake API server over HTTP.
* :class:`PodResourcesApi` — which container holds which device id, from the kubelet's
  PodResources v1 ``List`` over its unix socket; :class:`KubeletPodResourcesApi` is the real
  one (grpc.aio). The kubelet emulator serves the same API in tests.

Wire types stop here: callers get pod JSON dicts and :class:`DeviceHolding` values.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import lightkube
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from kubegpu.kube.inventory import publish_node_inventory_async
from kubegpu.kubelet.api.podresources.v1 import api_pb2, api_pb2_grpc
from kubegpu.kubelet.channels import unix_aio_channel
from kubegpu.sharing.annotations import NodeGpuInventory

log = logging.getLogger(__name__)


class ConflictError(Exception):
    """The pod changed since it was read (HTTP 409): read it again and redo the decision."""


@dataclass(frozen=True)
class PodListing:
    """This node's pods and the resourceVersion the list was taken at (where a watch starts)."""

    pods: list[dict[str, Any]]
    resource_version: str


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


class LightkubeNodeApi:
    def __init__(self, client: lightkube.AsyncClient, node_name: str) -> None:
        self.client = client
        self.node = node_name

    async def list_node_pods(self) -> PodListing:
        listing = self.client.list(Pod, namespace="*", fields={"spec.nodeName": self.node})
        pods = [pod.to_dict() async for pod in listing]
        return PodListing(pods, listing.resourceVersion)

    async def watch_node_pods(
        self, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        # lightkube re-opens a stream the server ended cleanly, from the last version it saw.
        stream = self.client.watch(
            Pod,
            namespace="*",
            fields={"spec.nodeName": self.node},
            resource_version=resource_version,
            server_timeout=timeout_s,
        )
        async for event, pod in stream:
            yield event, pod.to_dict()

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> None:
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        try:
            await self.client.patch(
                Pod, name, {"metadata": metadata}, namespace=namespace, patch_type=PatchType.MERGE
            )
        except ApiError as exc:
            if exc.status.code == 409:
                raise ConflictError(f"pod {namespace}/{name} changed meanwhile") from exc
            raise

    async def publish_inventory(self, inventory: NodeGpuInventory) -> bool:
        return await publish_node_inventory_async(self.client, self.node, inventory)

    async def close(self) -> None:
        await self.client.close()


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
