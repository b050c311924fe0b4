"""The node's pods over lightkube: the real :class:`~kubegpu.exporter.pods.NodePodsApi`."""

from __future__ import annotations

import lightkube
from lightkube.resources.core_v1 import Pod

from kubegpu.core.apiserver import NodePod


class LightkubeNodePods:
    def __init__(self, client: lightkube.Client) -> None:
        self.client = client

    def list_node_pods(self, node_name: str) -> list[NodePod]:
        pods = []
        for pod in self.client.list(Pod, namespace="*", fields={"spec.nodeName": node_name}):
            meta = pod.metadata
            if meta is None or not meta.uid or not meta.name or not meta.namespace:
                continue
            annotations = dict(meta.annotations or {})
            pods.append(NodePod(meta.uid, meta.namespace, meta.name, annotations))
        return pods
