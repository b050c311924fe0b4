"""The DRA driver's API server access: one lightkube client behind both DRA ports.

The role may not import lightkube, so the client is made here, on the running loop (it must be
closed on that loop too), from the kubeconfig :func:`~kubegpu.kube.client.load_kubeconfig`
found and checked before anything started.
"""

from __future__ import annotations

from typing import Any

import lightkube

from kubegpu.kube.pool_allocations import WatchedPoolAllocations
from kubegpu.kube.resource_claims import LightkubeResourceClaimSource
from kubegpu.kube.resource_slices import LightkubeResourceSliceSink

FIELD_MANAGER = "kubegpu-dra-driver"


class DraApi:
    """The claim source and the slice sink of one node's driver, sharing one client."""

    def __init__(self, kube_config: Any) -> None:
        self._client = lightkube.AsyncClient(kube_config, field_manager=FIELD_MANAGER)
        self.claims = LightkubeResourceClaimSource(self._client)
        self.slices = LightkubeResourceSliceSink(self._client)

    def pool_watch(self, driver: str) -> WatchedPoolAllocations:
        """The claims of every pool of ``driver``, by list + watch (steering)."""
        return WatchedPoolAllocations(self._client, driver)

    async def close(self) -> None:
        await self._client.close()
