"""The Node's labels over lightkube: the real :class:`~kubegpu.labels.sinks.NodeLabelsApi`.

The labeller computes which labels change (it owns that rule); this module only reads and
patches, turning a 409 into :class:`~kubegpu.core.apiserver.ConflictError` (the API's own
error as its cause) so the labels edge can retry without importing lightkube.
"""

from __future__ import annotations

from collections.abc import Mapping

import lightkube
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from kubegpu.core.apiserver import ConflictError


class LightkubeNodeLabels:
    def __init__(self, client: lightkube.Client) -> None:
        self.client = client

    def read_labels(self, node_name: str) -> tuple[dict[str, str], str | None]:
        metadata = self.client.get(Node, name=node_name).metadata
        labels = dict((metadata.labels if metadata else None) or {})
        return labels, metadata.resourceVersion if metadata else None

    def patch_labels(
        self, node_name: str, patch: Mapping[str, str | None], resource_version: str | None
    ) -> None:
        body = {"metadata": {"labels": dict(patch), "resourceVersion": resource_version}}
        try:
            self.client.patch(Node, node_name, body, patch_type=PatchType.MERGE)
        except ApiError as exc:
            if exc.status.code == 409:
                raise ConflictError(f"node {node_name} changed meanwhile") from exc
            raise
