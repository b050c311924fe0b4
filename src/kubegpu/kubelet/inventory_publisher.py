"""Keeps the Node annotation ``kubegpu.io/gpu-inventory`` true: the node's cards and their health.

The whole document is written from what the agent sees now, on start, on every health change
(the board tells it of each flip) and periodically, so a Node re-created or edited by hand gets
it back. The extender reads it to know which cards it may place shares on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import NodeInventory
from kubegpu.core.health_feed import HealthFeed
from kubegpu.kubelet.retry import RetryBackoff, short_error

if TYPE_CHECKING:
    from kubegpu.kubelet.cluster import NodeApi

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
                records = inventory_records(self.inventory, self.health.unhealthy().keys())
                await self.api.publish_inventory(records)
                # Re-asserted with it: the kubelet drops patched figures when it re-registers.
                await publish_peer_capacity(
                    self.api, self.config, [g.memory_total_mib for g in self.inventory.gpus]
                )
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
