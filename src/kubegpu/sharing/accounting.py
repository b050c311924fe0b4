"""Card-level accounting: what each card has left, from the node inventory and the pods on it.

The extender's cluster view is a set of :class:`NodeInfo` (allocatable CPU/memory plus the
published inventory) and :class:`PodUsage` (what each non-terminated pod holds, read back from
its allocation annotation). This module turns them into the placement engine's
:class:`~kubegpu.placement.model.NodeState` and answers "is any card over capacity?" — the same
arithmetic for the live extender, a restarted one and the tests that audit the annotations.
Pure: values in, values out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kubegpu.core.names import model_key
from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState
from kubegpu.sharing.annotations import CardShare, NodeGpuInventory


class ReservationHeld(Exception):
    """A pod already has a reservation: another bind of it has not settled."""


@dataclass(frozen=True)
class NodeInfo:
    """A node as the extender sees it. ``inventory`` is ``None`` when the node agent has not
    published one (or it did not parse: ``inventory_error`` says why)."""

    name: str
    cpu_milli: int
    memory_mib: int
    inventory: NodeGpuInventory | None = None
    inventory_error: str = ""


@dataclass(frozen=True)
class PodUsage:
    """What one pod holds on ``node``. ``cards`` comes from its allocation annotation;
    ``undecided_whole_gpus`` counts whole GPUs of a pod bound without one (another scheduler
    placed it, so we do not know which cards the kubelet gave it)."""

    uid: str
    key: str  # namespace/name, for logs and reasons
    node: str
    cpu_milli: int
    host_memory_mib: int
    cards: tuple[CardShare, ...] = ()
    undecided_whole_gpus: int = 0
    bound: bool = True  # False: decided and recorded, binding not yet seen


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything the extender's state is built from; two views of the same cluster compare
    equal (the restart test's yardstick)."""

    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    pods: Mapping[str, PodUsage] = field(default_factory=dict)

    def node_states(self) -> list[NodeState]:
        by_node: dict[str, list[PodUsage]] = defaultdict(list)
        for usage in self.pods.values():
            by_node[usage.node].append(usage)
        return [node_state(info, by_node.get(name, ())) for name, info in self.nodes.items()]


def node_model(inventory: NodeGpuInventory | None) -> str:
    """The model every card of the node has (as :func:`~kubegpu.core.names.model_key` spells
    it), ``""`` when the cards mix models (each card then carries its own, see
    :func:`node_state`) or there are none."""
    if inventory is None:
        return ""
    models = {model_key(g.model) for g in inventory.gpus}
    return models.pop() if len(models) == 1 else ""


def card_usage(
    inventory: NodeGpuInventory | None, usages: Iterable[PodUsage]
) -> dict[str, tuple[int, int]]:
    """Per card UUID: (compute milli, memory MiB) held, including cards taken by pods without a
    decision (the highest-index cards still free: an assumption, logged by the view)."""
    used: dict[str, list[int]] = {}
    if inventory is not None:
        used = {g.uuid: [0, 0] for g in inventory.gpus}
    undecided = 0
    for usage in usages:
        undecided += usage.undecided_whole_gpus
        for card in usage.cards:
            slot = used.setdefault(card.uuid, [0, 0])
            slot[0] += card.compute_milli
            slot[1] += card.gpu_memory_mib
    if undecided and inventory is not None:
        for gpu in sorted(inventory.gpus, key=lambda g: -g.index):
            if undecided == 0:
                break
            if used[gpu.uuid] == [0, 0]:
                used[gpu.uuid] = [MILLI_PER_GPU, gpu.memory_mib]
                undecided -= 1
    return {uuid: (v[0], v[1]) for uuid, v in used.items()}


def node_state(info: NodeInfo, usages: Iterable[PodUsage]) -> NodeState:
    """The engine's view of one node: allocatable minus requests, and per healthy card what is
    left, with the card's model from the inventory in :func:`~kubegpu.core.names.model_key`
    spelling, the one pods' model lists are compared in (a node may mix models; a pod
    restricted to models is placed only on cards of those). Unhealthy cards stay in (so pods
    already on them keep their index) with nothing free; cards a decision names but the
    inventory no longer has are ignored."""
    usages = list(usages)
    cpu_used = sum(u.cpu_milli for u in usages)
    memory_used = sum(u.host_memory_mib for u in usages)
    held = card_usage(info.inventory, usages)
    gpus: list[GpuState] = []
    if info.inventory is not None:
        for gpu in info.inventory.gpus:
            milli, memory = held.get(gpu.uuid, (0, 0))
            if gpu.healthy:
                gpus.append(
                    GpuState(
                        gpu.index,
                        max(0, MILLI_PER_GPU - milli),
                        max(0, gpu.memory_mib - memory),
                        model_key(gpu.model),
                        gpu.memory_mib,
                    )
                )
            else:
                gpus.append(GpuState(gpu.index, 0, 0, model_key(gpu.model), gpu.memory_mib))
    return NodeState(
        info.name,
        cpu_capacity_milli=info.cpu_milli,
        # A node can hold more than it has (pods another scheduler placed, allocatable that
        # shrank under running pods): nothing is free then, as on an over-full card, rather
        # than a negative amount that reasons would print and scores would reward.
        cpu_free_milli=max(0, info.cpu_milli - cpu_used),
        memory_free_mib=max(0, info.memory_mib - memory_used),
        gpu_model=node_model(info.inventory),
        gpus=tuple(gpus),
    )


def over_capacity(inventory: NodeGpuInventory, usages: Iterable[PodUsage]) -> list[str]:
    """Human-readable lines for every card holding more than it has (empty when sound)."""
    problems: list[str] = []
    held = card_usage(inventory, usages)
    for gpu in inventory.gpus:
        milli, memory = held.get(gpu.uuid, (0, 0))
        if milli > MILLI_PER_GPU:
            problems.append(f"card {gpu.uuid} (index {gpu.index}): {milli} milli held, 1000 exist")
        if memory > gpu.memory_mib:
            problems.append(
                f"card {gpu.uuid} (index {gpu.index}): {memory} MiB held, {gpu.memory_mib} exist"
            )
    return problems


def snapshot_from(nodes: Iterable[NodeInfo], pods: Iterable[PodUsage]) -> ClusterSnapshot:
    return ClusterSnapshot(
        nodes={n.name: n for n in sorted(nodes, key=lambda n: n.name)},
        pods={p.uid: p for p in sorted(pods, key=lambda p: p.uid)},
    )
