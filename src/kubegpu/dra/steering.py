"""Steering DRA's first fit: the order in which the driver lists its node's devices.

DRA's allocator (kube-scheduler, ``k8s.io/dynamic-resource-allocation`` v0.35) takes the first
device of a pool, in slice order, that fits the request; nothing scores devices yet (KEP-4970).
So the order the driver publishes *is* the card choice. This module computes the order the
simulator's ``steered`` mode uses (:mod:`kubegpu.placement.device_order`), from what
the driver can see: its inventory and the claims allocated from its pool.

* :func:`card_free_milli`: each card's free share in milli-cards, the smaller of its free
  memory and free compute, as the allocator's accounting leaves them (every allocated device
  of our pool: a share consumes its ``consumedCapacity``, a whole-card allocation the card).
* :func:`steered_order`: the GPU indices in the order that minimises the expected cost of the
  next share's first fit over the target workload's share classes, under 07-Kubegpu's card
  key, by running :class:`~kubegpu.placement.device_order.DeviceOrderEngine` on a
  one-node cluster of this node.

The order never decides whether a claim fits: the allocator checks every device's remaining
capacity itself, the order only says which fitting device it meets first. A stale order (the
claims moved on since it was computed) is therefore steered less, never wrong.

What the driver does not see is the node's CPU taken by other pods; it takes the node's whole
CPU as free (``cpu_milli``), so the CPU-stranding part of the cost is not binding here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

from kubegpu.core.dra import AllocatedDevice, device_index
from kubegpu.core.dra_ports import PoolAllocationSource
from kubegpu.core.gpu import NodeInventory
from kubegpu.dra.slices import COMPUTE_MILLI_PER_CARD
from kubegpu.placement.device_order import CardChoice, DeviceOrderEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState

log = logging.getLogger(__name__)

# The policy whose card key the order serves: ours.
STEERING_POLICY = "kubegpu"


def card_free_milli(
    inventory: NodeInventory, pool: str, allocated: Iterable[AllocatedDevice]
) -> dict[int, int]:
    """Free milli-cards per GPU index after ``allocated`` (devices of other pools or that name
    no GPU of ours are ignored): the smaller of the free memory and free compute fractions,
    rounded down, never below 0."""
    memory_total = {g.index: g.memory_total_mib * 2**20 for g in inventory.gpus}
    memory_used = dict.fromkeys(memory_total, 0)
    compute_used = dict.fromkeys(memory_total, 0)
    for device in allocated:
        index = device_index(device.device)
        if device.pool != pool or index not in memory_total:
            continue
        if device.memory_bytes is None and device.compute_milli is None:
            # A whole-card allocation (or one that consumed no capacity): the card is taken.
            memory_used[index] += memory_total[index]
            compute_used[index] += COMPUTE_MILLI_PER_CARD
            continue
        memory_used[index] += device.memory_bytes or 0
        compute_used[index] += device.compute_milli or 0
    free: dict[int, int] = {}
    for index, total in memory_total.items():
        memory_left = 1.0 - memory_used[index] / total if total > 0 else 1.0
        compute_left = 1.0 - compute_used[index] / COMPUTE_MILLI_PER_CARD
        fraction = min(memory_left, compute_left)
        free[index] = max(0, min(MILLI_PER_GPU, math.floor(fraction * MILLI_PER_GPU + 1e-9)))
    return free


def steered_order(
    inventory: NodeInventory,
    free_milli: Mapping[int, int],
    workload: TypicalWorkload,
    cpu_milli: int,
) -> tuple[int, ...]:
    """The node's GPU indices in the order the driver should list them."""
    indices = sorted(g.index for g in inventory.gpus)
    if not indices:
        return ()
    models = {g.index: g.product_name for g in inventory.gpus}
    # The engine's card columns are positions 0..n-1 in GPU index order.
    node = NodeState(
        name="node",
        cpu_capacity_milli=cpu_milli,
        cpu_free_milli=cpu_milli,
        memory_free_mib=2**40,
        gpus=tuple(
            GpuState(
                index=position, free_milli=free_milli.get(index, MILLI_PER_GPU), model=models[index]
            )
            for position, index in enumerate(indices)
        ),
    )
    engine = DeviceOrderEngine([node], STEERING_POLICY, workload, card_choice=CardChoice.STEERED)
    return tuple(indices[int(column)] for column in engine.device_order(0))


class DeviceSteerer:
    """The steered order of one node's devices, from the claims allocated from its pool now.

    Each :meth:`order` lists the pool's allocations through the port (the API server) and
    recomputes the order only when the cards' free state changed since the last call.
    """

    def __init__(
        self,
        inventory: NodeInventory,
        driver: str,
        pool: str,
        allocations: PoolAllocationSource,
        workload: TypicalWorkload,
        cpu_milli: int,
    ) -> None:
        self.inventory = inventory
        self.driver = driver
        self.pool = pool
        self.allocations = allocations
        self.workload = workload
        self.cpu_milli = cpu_milli
        self._last: tuple[tuple[tuple[int, int], ...], tuple[int, ...]] | None = None

    async def order(self) -> tuple[int, ...]:
        """Raises whatever the port raises (the caller keeps the order it had)."""
        allocated = await self.allocations.pool_allocations(self.driver, self.pool)
        free = card_free_milli(self.inventory, self.pool, allocated)
        state = tuple(sorted(free.items()))
        if self._last is not None and self._last[0] == state:
            return self._last[1]
        order = steered_order(self.inventory, free, self.workload, self.cpu_milli)
        log.info(
            "node pool %s: cards free (milli) %s, steered device order %s",
            self.pool,
            ", ".join(f"gpu-{i}={f}" for i, f in state),
            ",".join(f"gpu-{i}" for i in order),
        )
        self._last = (state, order)
        return order
