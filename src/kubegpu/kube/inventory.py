"""Publishing the node's GPU inventory on its Node object, and reading it back.

The node agent calls :func:`publish_node_inventory` (or the async twin) on start and on every
health change. It always writes the complete document computed from what the agent sees now,
so a restarted agent re-asserts the truth without reading what an earlier one wrote. The write
is a JSON merge patch of one annotation key we own: no other annotation is touched, and no
resourceVersion precondition is needed because the whole value is replaced.

:func:`publish_node_mig_devices_async` does the same for ``kubegpu.io/mig-devices`` (the cards
the agent serves by their MIG devices), and removes that key when there are none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    MIG_DEVICES_ANNOTATION,
    NodeGpuInventory,
    NodeMigDevices,
    decode_inventory,
    encode_inventory,
    encode_mig_devices,
)

log = logging.getLogger(__name__)


def _current(node: Node, key: str = INVENTORY_ANNOTATION) -> str | None:
    annotations = (node.metadata.annotations if node.metadata else None) or {}
    return annotations.get(key)


def _patch(text: str | None, key: str = INVENTORY_ANNOTATION) -> dict[str, Any]:
    # In a JSON merge patch, null removes the key.
    return {"metadata": {"annotations": {key: text}}}


def publish_node_inventory(
    client: lightkube.Client, node_name: str, inventory: NodeGpuInventory
) -> bool:
    """Make the Node's inventory annotation equal ``inventory``; True if it had to be written."""
    text = encode_inventory(inventory)
    if _current(client.get(Node, name=node_name)) == text:
        log.debug("node %s: GPU inventory annotation already current", node_name)
        return False
    client.patch(Node, node_name, _patch(text), patch_type=PatchType.MERGE)
    log.info("node %s: published inventory of %d GPUs", node_name, len(inventory.gpus))
    return True


async def publish_node_inventory_async(
    client: lightkube.AsyncClient, node_name: str, inventory: NodeGpuInventory
) -> bool:
    """:func:`publish_node_inventory` for asyncio callers."""
    text = encode_inventory(inventory)
    if _current(await client.get(Node, name=node_name)) == text:
        log.debug("node %s: GPU inventory annotation already current", node_name)
        return False
    await client.patch(Node, node_name, _patch(text), patch_type=PatchType.MERGE)
    log.info("node %s: published inventory of %d GPUs", node_name, len(inventory.gpus))
    return True


async def publish_node_mig_devices_async(
    client: lightkube.AsyncClient, node_name: str, devices: NodeMigDevices | None
) -> bool:
    """Make the Node's MIG devices annotation equal ``devices``, or remove it when ``None``;
    True if it had to be written."""
    key = MIG_DEVICES_ANNOTATION
    text = None if devices is None else encode_mig_devices(devices)
    if _current(await client.get(Node, name=node_name), key) == text:
        return False
    await client.patch(Node, node_name, _patch(text, key), patch_type=PatchType.MERGE)
    if devices is None:
        log.info("node %s: removed the MIG devices annotation (no card in MIG mode)", node_name)
    else:
        log.info(
            "node %s: published %d MIG devices on %d cards in MIG mode",
            node_name,
            sum(len(g.devices) for g in devices.gpus),
            len(devices.gpus),
        )
    return True


def read_node_inventory(node: Node | Mapping[str, Any]) -> NodeGpuInventory | None:
    """The inventory published on ``node`` (lightkube Node or JSON); ``None`` when absent.
    Raises :class:`~kubegpu.sharing.annotations.AnnotationError` when malformed."""
    if isinstance(node, Node):
        raw = _current(node)
    else:
        meta = node.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(INVENTORY_ANNOTATION)
    return None if raw is None else decode_inventory(raw)
