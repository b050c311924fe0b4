"""The node agent's API server access: the real :class:`~kubegpu.kubelet.cluster.NodeApi`.

This node's pods (a list with its resourceVersion, and a watch from one), annotation patches on
them, and the node's GPU inventory and MIG devices annotations, over lightkube's async client.
The kubelet edge declares the port and never imports lightkube; :mod:`kubegpu.roles.node_agent`
hands it this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import lightkube
from lightkube import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from kubegpu.core.apiserver import ConflictError, PodListing
from kubegpu.kube.client import KubeconfigError, load_kubeconfig_file
from kubegpu.kube.inventory import publish_node_inventory_async, publish_node_mig_devices_async
from kubegpu.kube.list_watch import RawPod, watch_events
from kubegpu.kube.node_capacity import publish_node_capacity_async
from kubegpu.sharing.annotations import NodeGpuInventory, NodeMigDevices

FIELD_MANAGER = "kubegpu-node-agent"


class AgentKubeconfigError(Exception):
    """``--kubeconfig`` names a file lightkube cannot use (exit 2, like any bad input)."""


def kube_config_for(kubeconfig: Path | None) -> Any:
    """lightkube config from ``--kubeconfig``, else the in-cluster service account."""
    from lightkube.config.kubeconfig import KubeConfig

    if kubeconfig is None:
        return KubeConfig.from_service_account()
    try:
        # The one loader every role uses: a malformed file, or a certificate or key file it
        # names that is missing, is one message naming the kubeconfig (and that file).
        return load_kubeconfig_file(kubeconfig)
    except KubeconfigError as exc:
        raise AgentKubeconfigError(f"cannot use {exc}") from exc


def open_node_api(kube_config: Any, node_name: str) -> LightkubeNodeApi:
    """An async client on the running loop (close it with ``close()`` on the same loop)."""
    return LightkubeNodeApi(
        lightkube.AsyncClient(kube_config, field_manager=FIELD_MANAGER), node_name
    )


def sync_client_factory(kube_config: Any) -> Callable[[], lightkube.Client]:
    def make() -> lightkube.Client:
        return lightkube.Client(kube_config, field_manager=FIELD_MANAGER)

    return make


class LightkubeNodeApi:
    """Pod JSON dicts out, lightkube stays here; a 409 becomes :class:`ConflictError`."""

    def __init__(self, client: lightkube.AsyncClient, node_name: str) -> None:
        self.client = client
        self.node = node_name

    async def list_node_pods(self) -> PodListing:
        listing = self.client.list(RawPod, namespace="*", fields={"spec.nodeName": self.node})
        pods = [dict(pod) async for pod in listing]  # plain JSON, as the watch gives it
        return PodListing(pods, listing.resourceVersion)

    async def watch_node_pods(
        self, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        # lightkube re-opens a stream the server ended cleanly, from the last version it saw.
        stream = watch_events(
            self.client,
            Pod,
            namespace="*",
            fields={"spec.nodeName": self.node},
            resource_version=resource_version,
            server_timeout=timeout_s,
        )
        async for event, pod in stream:
            yield event, pod

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

    async def publish_mig_devices(self, devices: NodeMigDevices | None) -> bool:
        return await publish_node_mig_devices_async(self.client, self.node, devices)

    async def publish_node_capacity(self, figures: Mapping[str, str]) -> bool:
        return await publish_node_capacity_async(self.client, self.node, figures)

    async def close(self) -> None:
        await self.client.close()
