"""ResourceSlices (``resource.k8s.io/v1``) written for the DRA driver, through lightkube.

The node's slices of one driver are found by the field selectors the API server supports for
ResourceSlices (``spec.nodeName``, ``spec.driver``); applying makes that set exactly the given
slices: create the missing, replace the changed (with the resourceVersion read, so a
concurrent writer is a conflict, not a lost update), delete the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightkube
from lightkube.generic_resource import create_global_resource

ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")


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
