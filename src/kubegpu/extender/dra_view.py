"""What DRA ranking needs of the cluster: our driver's ResourceSlices and the ResourceClaims, as
a port, so the extender edge does not import the kube edge.

The real one is :class:`kubegpu.kube.dra_view.DraClusterView` (list + watch of both kinds);
:class:`FakeDraCluster` is the scriptable one the unit tests drive.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from kubegpu.core.dra import AllocatedDevice
from kubegpu.core.dra_cluster import DraClaim, NodeSlices, SliceDevice, newest_devices


class DraClusterState(Protocol):
    """Our driver's devices per node and every claim, as last seen."""

    synced: asyncio.Event  # set once both kinds have been listed

    def start(self) -> None:
        """Begin watching (idempotent): the extender watches DRA objects only once kube-scheduler
        has asked it to rank DRA nodes, so an install without the DRA entry costs nothing."""
        ...

    def devices_on(self, node: str) -> tuple[SliceDevice, ...]:
        """The devices of the newest generation of each of ``node``'s pools; () without a
        slice."""
        ...

    def allocated_in(self, pool: str) -> list[AllocatedDevice]:
        """Every device of ``pool`` that an allocated claim holds, with what it consumed."""
        ...

    def claim(self, namespace: str, name: str) -> DraClaim | None: ...


class FakeDraCluster:
    """Slices and claims set by the test; ``started`` says whether ranking asked for them."""

    def __init__(self) -> None:
        self.slices: dict[str, NodeSlices] = {}
        self.claims: dict[tuple[str, str], DraClaim] = {}
        self.synced = asyncio.Event()
        self.synced.set()
        self.started = 0

    def start(self) -> None:
        self.started += 1

    def publish(self, name: str, slice_: NodeSlices) -> None:
        self.slices[name] = slice_

    def put_claim(self, claim: DraClaim) -> None:
        self.claims[(claim.ref.namespace, claim.ref.name)] = claim

    def devices_on(self, node: str) -> tuple[SliceDevice, ...]:
        return newest_devices(s for s in self.slices.values() if s.node == node)

    def allocated_in(self, pool: str) -> list[AllocatedDevice]:
        return [d for c in self.claims.values() for d in c.devices if d.pool == pool]

    def claim(self, namespace: str, name: str) -> DraClaim | None:
        return self.claims.get((namespace, name))
