"""Keeps the node's ResourceSlices equal to what the inventory and health say.

The generation must grow across driver restarts (consumers trust only the highest generation of
a pool), so the first publish starts above whatever the API server holds. A publish that would
not change the devices (their order included) is skipped, so a steered order is re-published
only when it changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.core.dra import DraNaming
from kubegpu.core.dra_ports import ResourceSliceSink
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.slices import build_resource_slices

log = logging.getLogger(__name__)


class ResourceSlicePublisher:
    def __init__(
        self,
        node_name: str,
        naming: DraNaming,
        sink: ResourceSliceSink,
        *,
        dynamic_mig: bool = False,
    ) -> None:
        self.node_name = node_name
        self.dynamic_mig = dynamic_mig
        self.naming = naming
        self.driver = naming.driver
        self.sink = sink
        self.generation: int | None = None
        self._published: list[dict[str, Any]] | None = None

    async def publish(
        self,
        inventory: NodeInventory,
        unhealthy: Mapping[str, str] | None = None,
        order: Sequence[int] | None = None,
    ) -> bool:
        """Write the slices if they differ from the last ones written (a new device order is a
        difference); True when written."""
        if self.generation is None:
            self.generation = await self.sink.current_generation(self.node_name, self.driver)
        candidate = build_resource_slices(
            self.node_name,
            inventory,
            naming=self.naming,
            generation=self.generation + 1,
            unhealthy=unhealthy,
            order=order,
            dynamic_mig=self.dynamic_mig,
        )
        if self._published is not None and _devices(candidate) == _devices(self._published):
            return False
        await self.sink.apply_slices(self.node_name, self.driver, candidate)
        self.generation += 1
        self._published = candidate
        log.info(
            "published %d ResourceSlice(s) for node %s, driver %s, generation %d (%d unhealthy, "
            "devices in order %s)",
            len(candidate),
            self.node_name,
            self.driver,
            self.generation,
            len(unhealthy or {}),
            ",".join(str(d["name"]) for s in candidate for d in s["spec"].get("devices", ())),
        )
        return True

    def forget(self) -> None:
        """The slices were wiped (kubelet restart): the next publish writes them again."""
        self._published = None


def _devices(slices: list[dict[str, Any]]) -> list[Any]:
    return [(s["spec"].get("devices"), s["spec"].get("sharedCounters")) for s in slices]
