"""The Kubernetes API as the DRA driver needs it: two small ports, each with a fake.

The real implementations use lightkube and live in :mod:`kubegpu.kube.resource_claims` and
:mod:`kubegpu.kube.resource_slices`; the fakes here are what the unit tests and the emulated
node drive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from kubegpu.core.dra import AllocatedDevice, ClaimAllocation, ClaimRef, DeviceConfig


class ClaimLookupError(LookupError):
    """The claim cannot be prepared: absent, another UID, not allocated, malformed, or the API
    server did not hand it over (an error status, no answer). Fails that claim alone."""


class ResourceClaimSource(Protocol):
    async def allocation(self, claim: ClaimRef, driver: str) -> ClaimAllocation:
        """The claim's allocation results for ``driver``; raises :class:`ClaimLookupError`."""
        ...


class PoolAllocationSource(Protocol):
    async def pool_allocations(self, driver: str, pool: str) -> list[AllocatedDevice]:
        """Every device of ``pool`` allocated to a claim now (all namespaces), each with the
        capacity it consumed: what the allocator counts as taken from the pool."""
        ...


class WatchedPoolAllocationSource(PoolAllocationSource, Protocol):
    """A :class:`PoolAllocationSource` kept current by a watch, answering from memory, that
    says when a pool's allocations change (:mod:`kubegpu.kube.pool_allocations`)."""

    def start(self) -> None: ...

    async def close(self) -> None: ...

    def changed(self, pool: str) -> asyncio.Event:
        """Set whenever ``pool``'s allocations may have changed; the caller clears it."""
        ...


class ResourceClaimReader(ResourceClaimSource, PoolAllocationSource, Protocol):
    """Both claim reads of a driver: one claim to prepare, all of its pool's to steer."""


class ResourceSliceSink(Protocol):
    async def current_generation(self, node_name: str, driver: str) -> int:
        """The highest pool generation among the node's slices of ``driver``; 0 when none."""
        ...

    async def apply_slices(
        self, node_name: str, driver: str, slices: Sequence[dict[str, Any]]
    ) -> None:
        """Make the node's slices of ``driver`` exactly ``slices`` (create/update, delete the
        rest)."""
        ...


class FakeResourceClaimSource:
    """Claims by UID, scriptable by the test; counts lookups so idempotency can be asserted."""

    def __init__(self) -> None:
        self.claims: dict[str, ClaimAllocation] = {}
        self.lookups = 0
        self.pool_lists = 0
        self.fail_lists = False  # set: pool_allocations raises, as an unreachable API server

    def allocate(
        self, claim: ClaimRef, *devices: AllocatedDevice, configs: Sequence[DeviceConfig] = ()
    ) -> None:
        """``configs``: our driver's opaque configs, lowest precedence first."""
        self.claims[claim.uid] = ClaimAllocation(claim, tuple(devices), tuple(configs))

    async def allocation(self, claim: ClaimRef, driver: str) -> ClaimAllocation:
        self.lookups += 1
        found = self.claims.get(claim.uid)
        if found is None or (found.claim.namespace, found.claim.name) != (
            claim.namespace,
            claim.name,
        ):
            raise ClaimLookupError(f"resourceclaim {claim} not found")
        return found

    async def pool_allocations(self, driver: str, pool: str) -> list[AllocatedDevice]:
        self.pool_lists += 1
        if self.fail_lists:
            raise ConnectionError("the fake API server is away")
        return [d for found in self.claims.values() for d in found.devices if d.pool == pool]

    def deallocate(self, uid: str) -> None:
        self.claims.pop(uid, None)


class FakeResourceSliceSink:
    def __init__(self) -> None:
        self.slices: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.applies = 0

    async def current_generation(self, node_name: str, driver: str) -> int:
        slices = self.slices.get((node_name, driver), [])
        return max((int(s["spec"]["pool"]["generation"]) for s in slices), default=0)

    async def apply_slices(
        self, node_name: str, driver: str, slices: Sequence[dict[str, Any]]
    ) -> None:
        self.applies += 1
        self.slices[(node_name, driver)] = list(slices)
