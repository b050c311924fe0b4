"""Extended-resource figures written straight into a Node's status (capacity and allocatable).

The peer compat modes show a peer's node figures (``volcano.sh/gpu-memory``,
``aliyun.com/gpu-count``, ...) the way the peers do: a merge patch of ``status.capacity`` and
``status.allocatable``, not a device plugin. Only the keys given are written; the write is
skipped when both maps already hold them, so the agent can re-assert them as often as it likes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

log = logging.getLogger(__name__)


def _status(node: Any) -> Mapping[str, Any]:
    raw = node.to_dict() if hasattr(node, "to_dict") else node
    status = raw.get("status") if isinstance(raw, Mapping) else None
    return status if isinstance(status, Mapping) else {}


def capacity_current(node: Any, figures: Mapping[str, str]) -> bool:
    """Whether ``node`` (lightkube Node or JSON) already shows ``figures`` in both maps."""
    status = _status(node)
    for part in ("capacity", "allocatable"):
        have = status.get(part)
        have = have if isinstance(have, Mapping) else {}
        if any(str(have.get(k)) != v for k, v in figures.items()):
            return False
    return True


async def publish_node_capacity_async(
    client: lightkube.AsyncClient, node_name: str, figures: Mapping[str, str]
) -> bool:
    """Make the Node's capacity and allocatable show ``figures``; True if written."""
    if capacity_current(await client.get(Node, name=node_name), figures):
        return False
    body = {"status": {"capacity": dict(figures), "allocatable": dict(figures)}}
    await client.patch(Node.Status, node_name, body, patch_type=PatchType.MERGE)
    log.info("node %s: capacity set for %s", node_name, ", ".join(sorted(figures)))
    return True
