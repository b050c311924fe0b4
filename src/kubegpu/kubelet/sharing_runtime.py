"""GPU sharing on the node while the agent runs: the sharing coordinator and, with
``enforcement: mps``, the supervised MPS control daemon its share slots use.

Both follow the config: started with it, stopped before a reload applies a new one and started
again after. The MPS daemon alone may outlive a reload: restarting it would cut off the CUDA
clients running on it, so it is kept while its settings are unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from kubegpu.config.model import AgentConfig
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.resources import ResourcePlan
from kubegpu.kubelet.retry import Sleep

if TYPE_CHECKING:
    # Imported where used: a node agent serving whole GPUs should not pay for card-level
    # sharing (the RSS target in docs/benchmarks.md).
    from kubegpu.enforcement.mps import MpsDaemon
    from kubegpu.kubelet.cluster import NodeApi, PodResourcesApi
    from kubegpu.kubelet.coordinator import SharingCoordinator

log = logging.getLogger(__name__)


class SharingRuntime:
    """Starts and stops the coordinator (and MPS daemon) for one config at a time."""

    def __init__(
        self,
        node: str,
        api: NodeApi,
        board: DeviceBoard,
        *,
        pod_resources: PodResourcesApi | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.node = node
        self.api = api
        self.board = board
        self.pod_resources = pod_resources
        self._sleep = sleep
        self.coordinator: SharingCoordinator | None = None
        self._task: asyncio.Task[None] | None = None
        self.mps: MpsDaemon | None = None

    async def start(self, config: AgentConfig, plans: list[ResourcePlan]) -> None:
        """Start sharing as ``config`` asks (nothing when ``sharing.gpuShare`` is off)."""
        share = config.sharing.gpu_share
        if not share.enabled:
            return
        from kubegpu.enforcement.mps import MpsDaemon, mps_spec_for
        from kubegpu.kubelet.coordinator import SharingCoordinator

        slot_cards = [str(g.uuid) for p in plans if p.share_slots for g in p.gpus]
        if share.enforcement == "mps":
            spec = mps_spec_for(share.mps, slot_cards)
            if self.mps is not None and self.mps.spec != spec:
                await self._stop_mps()
            if self.mps is None:
                self.mps = MpsDaemon(spec, node=self.node, sleep=self._sleep)
                await self.mps.start()
        else:
            await self._stop_mps()
        self.coordinator = SharingCoordinator(
            self.node,
            config,
            self.api,
            self.board,
            pod_resources=self.pod_resources,
        )
        self.coordinator.set_plans(plans)
        self._task = asyncio.create_task(self.coordinator.run(), name="gpu-share")
        log.info(
            "node %s: GPU sharing on: %d slots on each of %d cards as %s, enforcement %s",
            self.node,
            share.slots_per_card,
            len(slot_cards),
            share.resource_name,
            share.enforcement,
        )

    async def stop(self, *, keep_mps: bool = False) -> None:
        """Stop the coordinator; the MPS daemon too unless ``keep_mps`` (a reload keeps it
        when its settings are unchanged: restarting it would cut off running CUDA clients)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.coordinator = None
        if not keep_mps:
            await self._stop_mps()

    async def _stop_mps(self) -> None:
        mps, self.mps = self.mps, None
        if mps is not None:
            await mps.stop()
