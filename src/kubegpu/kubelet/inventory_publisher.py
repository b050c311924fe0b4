"""Keeps the Node annotation ``kubegpu.io/gpu-inventory`` true: the node's cards and their health.

The whole document is written from what the agent sees now, on start, on every health change
(the board tells it of each flip) and periodically, so a Node re-created or edited by hand gets
it back. The extender reads it to know which cards it may place shares on: a card in MIG mode
under ``flags.migStrategy`` ``single`` or ``mixed`` is left out (it is neither whole nor shared
there; its MIG devices are placed by kube-scheduler alone), as it is from the peers' figures.
Those cards are published beside it, by their MIG devices, in ``kubegpu.io/mig-devices`` (for
inspection; removed when there are none), on the same rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import GpuDevice, NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.kubelet.mig import cards_outside_mig
from kubegpu.kubelet.retry import RetryBackoff, short_error

if TYPE_CHECKING:
    from collections.abc import Collection

    from kubegpu.kubelet.cluster import NodeApi
    from kubegpu.sharing.annotations import NodeMigDevices

log = logging.getLogger(__name__)


class InventoryPublisher:
    """Publishes ``inventory`` with ``health``'s verdicts through ``api`` until stopped."""

    def __init__(
        self,
        api: NodeApi,
        node: str,
        inventory: NodeInventory,
        health: HealthFeed,
        backoff: RetryBackoff,
        config: AgentConfig,
    ) -> None:
        self.api = api
        self.node = node
        self.inventory = inventory
        self.health = health
        self.backoff = backoff
        # Read each round (the interval, the peer compat modes): a reload replaces it.
        self.config = config
        self.publications = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def changed(self) -> None:
        """Publish again now (a GPU's health flipped)."""
        if self._changed is not None:
            self._changed.set()

    def start(self) -> None:
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._publish(self._changed), name="publish-inventory")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _publish(self, changed: asyncio.Event) -> None:
        from kubegpu.kubelet.cluster import inventory_records
        from kubegpu.kubelet.peer_compat import publish_peer_capacity

        failures = 0
        while True:
            changed.clear()
            try:
                cards = cards_outside_mig(self.config.flags.mig_strategy, self.inventory.gpus)
                placed = dataclasses.replace(self.inventory, gpus=tuple(cards))
                unhealthy = self.health.unhealthy().keys()
                records = inventory_records(placed, unhealthy)
                await self.api.publish_inventory(records)
                # Re-asserted with it: the kubelet drops patched figures when it re-registers.
                await publish_peer_capacity(
                    self.api, self.config, [g.memory_total_mib for g in cards]
                )
                await self.api.publish_mig_devices(self._mig_devices(cards, unhealthy))
                self.publications += 1
                failures = 0
                wait_s = self.config.sharing.gpu_share.inventory_interval_s
            except Exception as err:  # API down: keep trying with the backoff
                wait_s = self.backoff.delay(failures)
                failures += 1
                log.warning(
                    "node %s: publishing the GPU inventory failed: %s; retrying in %.1fs",
                    self.node,
                    short_error(err),
                    wait_s,
                )
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns normally when the
            # event is set as the task is cancelled, and this loop would outlive its stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await changed.wait()

    def _mig_devices(
        self, outside: list[GpuDevice], unhealthy: Collection[str]
    ) -> NodeMigDevices | None:
        """The cards left out of the inventory, by their MIG devices, each device with the
        resource the device plugin's plans advertise it under."""
        from kubegpu.kubelet.cluster import mig_records
        from kubegpu.kubelet.plans import build_plans
        from kubegpu.kubelet.resources import PlanError

        placed = {g.uuid for g in outside}
        in_mig = [g for g in self.inventory.gpus if g.uuid not in placed]
        if not in_mig:
            return None
        try:
            plans = build_plans(self.config, self.inventory)
        except PlanError:  # the agent does not serve such a layout; show it without resources
            plans = []
        resources = {
            d.mig.uuid: p.resource_name for p in plans for d in p.devices if d.mig is not None
        }
        return mig_records(in_mig, unhealthy, resources)
