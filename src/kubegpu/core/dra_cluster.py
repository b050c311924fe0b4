"""What the cluster's DRA objects say about our driver's GPUs, as our own values.

The scheduler extender ranks DRA nodes from these (``kubegpu.extender.dra_rank``); the kube
edge decodes them from ResourceSlice and ResourceClaim JSON (``kubegpu.kube.resource_slices``,
``kubegpu.kube.resource_claims``, the one owner of each wire format). They sit in the core
because both edges use them and edges never import each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kubegpu.core.dra import AllocatedDevice, ClaimRef


@dataclass(frozen=True)
class SliceDevice:
    """One device of our driver in a ResourceSlice: a GPU of ``node``.

    ``tainted``: the device carries a ``NoSchedule`` or ``NoExecute`` taint (our unhealthy
    GPU), so the allocator gives it to no new claim."""

    node: str
    pool: str
    name: str  # gpu-<index>
    memory_bytes: int
    compute_milli: int
    model: str = ""
    tainted: bool = False


@dataclass(frozen=True)
class NodeSlices:
    """The devices one ResourceSlice publishes, with the pool generation it belongs to (the
    allocator uses only the newest generation of a pool)."""

    node: str
    pool: str
    generation: int
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True)
class DeviceRequest:
    """One ``exactly`` request of a claim for our DeviceClasses.

    ``memory_bytes`` / ``compute_milli`` are its capacity requests (consumable capacity),
    None where it names none (the device's request policy then charges its default: the whole
    card)."""

    name: str
    count: int
    memory_bytes: int | None = None
    compute_milli: int | None = None

    @property
    def whole(self) -> bool:
        return self.memory_bytes is None and self.compute_milli is None


@dataclass(frozen=True)
class DraClaim:
    """A ResourceClaim as the extender needs it: what it asks of our driver and, once
    allocated, the devices it holds.

    ``problem`` says why its demand cannot be read (a ``firstAvailable`` or ``All`` request
    for our classes, a bad quantity); ``""`` when it can."""

    ref: ClaimRef
    requests: tuple[DeviceRequest, ...] = ()
    allocated: bool = False
    devices: tuple[AllocatedDevice, ...] = ()
    problem: str = ""


def newest_devices(slices: Iterable[NodeSlices]) -> tuple[SliceDevice, ...]:
    """The devices of the newest generation of each pool among ``slices`` (one node's): a pool
    being rewritten may briefly have slices of two generations, and the allocator uses only
    the newest."""
    slices = list(slices)
    newest: dict[str, int] = {}
    for s in slices:
        newest[s.pool] = max(newest.get(s.pool, s.generation), s.generation)
    return tuple(
        d
        for s in sorted(slices, key=lambda s: s.pool)
        if s.generation == newest[s.pool]
        for d in s.devices
    )
