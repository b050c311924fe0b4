"""What a decision holds: the cards on its node, each container's whole cards, and the pod's
usage as the view counts it. Shared by the scheduler's decisions, the tentative reservations
of prioritize (:mod:`kubegpu.extender.inflight`) and preemption's nominations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubegpu.placement.model import MILLI_PER_GPU
from kubegpu.sharing.accounting import PodUsage
from kubegpu.sharing.annotations import (
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    NodeGpuInventory,
)
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.resources import GpuRequest, RequestKind, pod_key


def held_cards(
    inventory: NodeGpuInventory, request: GpuRequest, indices: Sequence[int]
) -> tuple[CardShare, ...]:
    """What ``request`` holds on the cards ``indices`` of a node: a share's compute and memory
    on its one card, or whole cards (all of each one's compute and memory)."""
    by_index = {g.index: g for g in inventory.gpus}
    if request.kind is RequestKind.SHARED:
        gpu = by_index[indices[0]]
        return (CardShare(gpu.uuid, gpu.index, request.compute_milli, request.gpu_memory_mib),)
    return tuple(
        CardShare(by_index[i].uuid, i, MILLI_PER_GPU, by_index[i].memory_mib) for i in indices
    )


def usage_of(
    pod: Mapping[str, Any], request: GpuRequest, decision: AllocationDecision, *, bound: bool
) -> PodUsage:
    """What ``pod`` holds once ``decision`` is made: its CPU and memory requests on the node,
    and the decided cards."""
    return PodUsage(
        pod_uid(pod),
        pod_key(pod),
        decision.node,
        request.cpu_milli,
        request.host_memory_mib,
        decision.cards,
        bound=bound,
    )


def split_whole(request: GpuRequest, cards: Sequence[CardShare]) -> tuple[ContainerAllocation, ...]:
    """Whole cards per container, in the kubelet's order (init containers, then app ones):
    sidecars and app containers hold distinct cards; a regular init container borrows the
    cards after the sidecars', which the app containers then reuse."""
    out: list[ContainerAllocation] = []
    position = 0
    ordered = [c for c in request.containers if c.init] + [
        c for c in request.containers if not c.init
    ]
    for c in ordered:
        if not c.whole_gpus:
            continue
        taken = tuple(cards[position : position + c.whole_gpus])
        if not c.init or c.sidecar:
            position += c.whole_gpus
        out.append(ContainerAllocation(c.name, c.init, taken))
    return tuple(out)
