"""The API-server calls of ``kubegpu demo`` (register its Nodes, submit and list its Pods).

The demo drives the real components against the fake API server; what it does itself over the
API is these few calls, kept here so lightkube stays in the kube edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import lightkube
import yaml
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Node, NodeStatus, Pod
from lightkube.types import PatchType

FIELD_MANAGER = "kubegpu-demo"

Client = lightkube.Client
AsyncClient = lightkube.AsyncClient


def demo_kube_config(kubeconfig: Path) -> KubeConfig:
    # From the parsed text: lightkube's from_file leaves the file handle open.
    return KubeConfig.from_dict(yaml.safe_load(kubeconfig.read_text()))


def sync_client(kubeconfig: Path) -> lightkube.Client:
    return lightkube.Client(
        demo_kube_config(kubeconfig), field_manager=FIELD_MANAGER, trust_env=False
    )


def async_client(kubeconfig: Path) -> lightkube.AsyncClient:
    return lightkube.AsyncClient(
        demo_kube_config(kubeconfig), field_manager=FIELD_MANAGER, trust_env=False
    )


def register_node(client: lightkube.Client, doc: dict[str, Any]) -> None:
    """Create a Node as a kubelet does at registration: create, then report status."""
    client.create(cast(Node, Node.from_dict(doc)))
    name = doc["metadata"]["name"]
    client.patch(NodeStatus, name, {"status": doc["status"]}, patch_type=PatchType.MERGE)


def node_annotations(client: lightkube.Client, name: str) -> dict[str, str]:
    obj = client.get(Node, name).to_dict()
    return dict((obj.get("metadata") or {}).get("annotations") or {})


async def create_pod(client: lightkube.AsyncClient, manifest: dict[str, Any]) -> None:
    await client.create(cast(Pod, Pod.from_dict(manifest)))


async def list_pods(
    client: lightkube.AsyncClient, namespace: str, labels: dict[str, Any]
) -> list[dict[str, Any]]:
    listing = client.list(Pod, namespace=namespace, labels=labels)
    return [p.to_dict() async for p in listing]
