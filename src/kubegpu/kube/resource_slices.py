"""ResourceSlices (``resource.k8s.io/v1``) written for the DRA driver, through lightkube.

The node's slices of one driver are found by the field selectors the API server supports for
ResourceSlices (``spec.nodeName``, ``spec.driver``); applying makes that set exactly the given
slices: create the missing, replace the changed (with the resourceVersion read, so a
concurrent writer is a conflict, not a lost update), delete the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import lightkube
from lightkube.generic_resource import create_global_resource

from kubegpu.core.dra import CAPACITY_COMPUTE, CAPACITY_MEMORY
from kubegpu.core.dra_cluster import NodeSlices, SliceDevice
from kubegpu.core.names import model_key
from kubegpu.sharing.claim_budget import DriverCards
from kubegpu.sharing.resources import RequestError, parse_quantity

log = logging.getLogger(__name__)

ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")

# Taint effects that keep the allocator from giving a device to a new claim.
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def _capacity(device: Mapping[str, Any], name: str) -> int:
    raw = (device.get("capacity") or {}).get(name) or {}
    value = raw.get("value") if isinstance(raw, Mapping) else None
    if value is None:
        raise RequestError(f"capacity {name} is missing")
    return int(parse_quantity(value))


def slice_devices(obj: Mapping[str, Any], driver: str) -> NodeSlices | None:
    """The GPUs one ResourceSlice of ``driver`` publishes, as the extender ranks them (the
    inverse of :func:`kubegpu.dra.slices.device_entry` for what ranking needs: memory and
    compute capacity, product name, taints). None for a slice of another driver or of no
    node; a device whose capacity cannot be read is left out with a warning (the allocator
    cannot share it by capacity either)."""
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    if spec.get("driver") != driver or not isinstance(node, str) or not node:
        return None
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name") or "")
    try:
        generation = int(pool.get("generation") or 0)
    except (TypeError, ValueError):
        generation = 0
    devices: list[SliceDevice] = []
    for device in spec.get("devices") or []:
        if not isinstance(device, Mapping):
            continue
        name = str(device.get("name") or "")
        try:
            memory = _capacity(device, CAPACITY_MEMORY)
            compute = _capacity(device, CAPACITY_COMPUTE)
        except RequestError as exc:
            log.warning("resourceslice on %s: device %s: %s; not ranked", node, name, exc)
            continue
        product = ((device.get("attributes") or {}).get("productName") or {}).get("string")
        taints = device.get("taints") or []
        devices.append(
            SliceDevice(
                node=node,
                pool=pool_name,
                name=name,
                memory_bytes=memory,
                compute_milli=compute,
                model=model_key(product) if isinstance(product, str) else "",
                tainted=any(
                    isinstance(t, Mapping) and t.get("effect") in _BLOCKING_EFFECTS for t in taints
                ),
            )
        )
    return NodeSlices(node, pool_name, generation, tuple(devices))


def card_memory(objs: Iterable[Mapping[str, Any]]) -> dict[str, DriverCards]:
    """Per driver, the largest card's memory and the largest pool's total that ``objs``
    (ResourceSlice JSON, any driver) publish, at each pool's newest generation: what the
    claim budget charges a request naming no memory (:mod:`kubegpu.sharing.claim_budget`).
    A device without a readable memory capacity is left out."""
    newest: dict[tuple[str, str], int] = {}
    devices: dict[tuple[str, str, int], list[int]] = {}
    for obj in objs:
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping) or not isinstance(spec.get("driver"), str):
            continue
        raw_pool = spec.get("pool")
        pool: Mapping[str, Any] = raw_pool if isinstance(raw_pool, Mapping) else {}
        key = (spec["driver"], str(pool.get("name") or ""))
        try:
            generation = int(pool.get("generation") or 0)
        except (TypeError, ValueError):
            generation = 0
        newest[key] = max(newest.get(key, generation), generation)
        found = devices.setdefault((*key, generation), [])
        for device in spec.get("devices") or []:
            if not isinstance(device, Mapping):
                continue
            try:
                found.append(_capacity(device, CAPACITY_MEMORY))
            except (RequestError, AttributeError):
                continue
    cards: dict[str, DriverCards] = {}
    for (driver, pool_name), generation in newest.items():
        memory = devices.get((driver, pool_name, generation), [])
        if not memory:
            continue
        seen = cards.get(driver, DriverCards(0, 0))
        cards[driver] = DriverCards(
            max(seen.largest_card_bytes, max(memory)),
            max(seen.largest_pool_bytes, sum(memory)),
        )
    return cards


class LightkubeResourceSliceSink:
    def __init__(self, client: lightkube.AsyncClient) -> None:
        self.client = client

    async def _existing(self, node_name: str, driver: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        async for obj in self.client.list(
            ResourceSlice, fields={"spec.nodeName": node_name, "spec.driver": driver}
        ):
            # A generic resource is the decoded JSON object itself (a dict subclass).
            body = dict(obj)
            found[body["metadata"]["name"]] = body
        return found

    async def current_generation(self, node_name: str, driver: str) -> int:
        existing = await self._existing(node_name, driver)
        return max(
            (
                int(s.get("spec", {}).get("pool", {}).get("generation", 0))
                for s in existing.values()
            ),
            default=0,
        )

    async def apply_slices(
        self, node_name: str, driver: str, slices: Sequence[dict[str, Any]]
    ) -> None:
        existing = await self._existing(node_name, driver)
        for body in slices:
            name = body["metadata"]["name"]
            current = existing.pop(name, None)
            if current is None:
                await self.client.create(ResourceSlice(**body))
                continue
            replacement = dict(body)
            replacement["metadata"] = {
                **body["metadata"],
                "resourceVersion": current["metadata"].get("resourceVersion"),
            }
            await self.client.replace(ResourceSlice(**replacement))
        for stale in existing:
            await self.client.delete(ResourceSlice, stale)
