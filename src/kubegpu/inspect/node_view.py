"""One node's view in the inspect report: its cards, who holds them, its warnings and totals.

:func:`node_view` turns a node's inventory and the facts of the GPU pods charged to it into a
:class:`~kubegpu.inspect.report.NodeView`: pods on the cards their decisions name (or the
kubelet reports), pods it cannot place (*unplaced*), the drift warnings a node can show, and
its :class:`~kubegpu.inspect.report.Totals`; :func:`sum_totals` adds nodes up. Separate from the
model, which reads pods and nodes and assembles the report: this is the per-node arithmetic.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubegpu.inspect.reading import node_address
from kubegpu.inspect.report import (
    CardView,
    DriftWarning,
    InventoryState,
    NodeView,
    PlacedBy,
    PodOnCard,
    Totals,
    UnplacedPod,
    UnplacedReason,
    UsageState,
    WarningKind,
)
from kubegpu.inspect.usage import NodeUsage, UsageResult
from kubegpu.placement.model import MILLI_PER_GPU
from kubegpu.sharing.accounting import NodeInfo
from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    AllocationDecision,
    CardShare,
    GpuRecord,
)


@dataclass
class PodFacts:
    namespace: str
    name: str
    phase: str
    node: str  # where it is charged
    bound: bool
    decision: AllocationDecision | None
    whole_gpus: int
    compute_milli: int
    gpu_memory_mib: int


@dataclass
class NodeWork:
    json: Mapping[str, Any]
    info: NodeInfo
    pods: list[PodFacts] = field(default_factory=list)


def node_view(
    item: NodeWork,
    advertised: int,
    result: UsageResult | None,
    warnings: list[DriftWarning],
) -> NodeView:
    name = item.info.name
    inventory = item.info.inventory
    if inventory is not None:
        state = InventoryState.OK
    elif item.info.inventory_error:
        state = InventoryState.INVALID
        warnings.append(
            DriftWarning(
                WarningKind.INVALID_INVENTORY,
                f"node {name}: {item.info.inventory_error}; its cards are unknown",
                node=name,
            )
        )
    else:
        state = InventoryState.MISSING
        if item.pods:
            warnings.append(
                DriftWarning(
                    WarningKind.MISSING_INVENTORY,
                    f"node {name}: {len(item.pods)} GPU pod(s) but no {INVENTORY_ANNOTATION} "
                    "annotation (node agent not running?); their cards are unknown",
                    node=name,
                )
            )
    records: dict[str, GpuRecord] = inventory.by_uuid() if inventory is not None else {}
    node_usage: NodeUsage | None = result.usage if result is not None else None
    held: dict[str, list[PodOnCard]] = defaultdict(list)
    unplaced: list[UnplacedPod] = []
    undecided: list[PodFacts] = []
    for facts in sorted(item.pods, key=lambda f: (f.namespace, f.name)):
        if facts.decision is None:
            if not facts.whole_gpus:
                continue
            # No decision names its cards, but the node's kubelet knows them: place the pod
            # there (marked as the kubelet's word) rather than on cards assumed free.
            placed = _kubelet_cards(facts, node_usage, records)
            for given in placed:
                pod_key3 = (facts.namespace, facts.name, given.uuid)
                held[given.uuid].append(
                    PodOnCard(
                        facts.namespace,
                        facts.name,
                        facts.phase,
                        False,
                        given.memory_mib,
                        MILLI_PER_GPU,
                        facts.bound,
                        node_usage.pod_memory_used_mib.get(pod_key3) if node_usage else None,
                        None,
                        PlacedBy.KUBELET,
                    )
                )
            if facts.whole_gpus > len(placed):
                undecided.append(replace(facts, whole_gpus=facts.whole_gpus - len(placed)))
            continue
        unknown: list[CardShare] = []
        for card in facts.decision.cards:
            record = records.get(card.uuid)
            if record is None:
                unknown.append(card)
                continue
            if record.index != card.index:
                warnings.append(
                    DriftWarning(
                        WarningKind.INDEX_MISMATCH,
                        f"pod {facts.namespace}/{facts.name}: decision says card {card.uuid} "
                        f"is index {card.index}; node {name} publishes index {record.index}",
                        node=name,
                        uuid=card.uuid,
                        pod=f"{facts.namespace}/{facts.name}",
                    )
                )
            pod_key3 = (facts.namespace, facts.name, card.uuid)
            held[card.uuid].append(
                PodOnCard(
                    facts.namespace,
                    facts.name,
                    facts.phase,
                    facts.decision.shared,
                    card.gpu_memory_mib,
                    card.compute_milli,
                    facts.bound,
                    node_usage.pod_memory_used_mib.get(pod_key3) if node_usage else None,
                    node_usage.pod_over_share.get(pod_key3) if node_usage else None,
                )
            )
        if unknown:
            reason = (
                UnplacedReason.UNKNOWN_CARD
                if inventory is not None
                else UnplacedReason.NO_INVENTORY
            )
            unplaced.append(
                UnplacedPod(
                    facts.namespace,
                    facts.name,
                    facts.phase,
                    reason,
                    0 if facts.decision.shared else len(unknown),
                    sum(c.compute_milli for c in unknown),
                    sum(c.gpu_memory_mib for c in unknown),
                )
            )
            if inventory is not None:
                for card in unknown:
                    warnings.append(
                        DriftWarning(
                            WarningKind.UNKNOWN_CARD,
                            f"pod {facts.namespace}/{facts.name}: decision names card "
                            f"{card.uuid} (index {card.index}), which node {name} does not have",
                            node=name,
                            uuid=card.uuid,
                            pod=f"{facts.namespace}/{facts.name}",
                        )
                    )

    cards: list[CardView] = []
    for record in inventory.gpus if inventory is not None else ():
        on_card = tuple(held.get(record.uuid, ()))
        cards.append(
            CardView(
                index=record.index,
                uuid=record.uuid,
                model=record.model,
                memory_mib=record.memory_mib,
                healthy=record.healthy,
                allocated_memory_mib=sum(p.memory_mib for p in on_card),
                allocated_compute_milli=sum(p.compute_milli for p in on_card),
                pods=on_card,
                used_memory_mib=node_usage.gpu_memory_used_mib.get(record.uuid)
                if node_usage
                else None,
                utilization_ratio=node_usage.gpu_utilization_ratio.get(record.uuid)
                if node_usage
                else None,
            )
        )
    _card_warnings(name, cards, warnings)

    # Whole-GPU pods without a decision: the extender assumes the highest-index cards still
    # free; we charge their memory the same way so both agree, but name no card.
    free_cards = sorted(
        (c for c in cards if c.allocated_memory_mib == 0 and c.allocated_compute_milli == 0),
        key=lambda c: -c.index,
    )
    free_count = len(free_cards)
    assumed: set[str] = set()
    wanted = 0
    for facts in undecided:
        taken, free_cards = free_cards[: facts.whole_gpus], free_cards[facts.whole_gpus :]
        assumed.update(c.uuid for c in taken)
        wanted += facts.whole_gpus
        reason = (
            UnplacedReason.NO_DECISION if inventory is not None else UnplacedReason.NO_INVENTORY
        )
        unplaced.append(
            UnplacedPod(
                facts.namespace,
                facts.name,
                facts.phase,
                reason,
                facts.whole_gpus,
                facts.whole_gpus * MILLI_PER_GPU,
                sum(c.memory_mib for c in taken),
            )
        )
    if inventory is not None and wanted > free_count:
        warnings.append(
            DriftWarning(
                WarningKind.NOT_ENOUGH_FREE_CARDS,
                f"node {name}: pods without a decision hold {wanted} whole GPU(s) but only "
                f"{free_count} card(s) are free of decided pods",
                node=name,
            )
        )
    if node_usage is not None:
        for shown in cards:
            for pod in shown.pods:
                if pod.over_share:
                    warnings.append(
                        DriftWarning(
                            WarningKind.OVER_SHARE,
                            f"pod {pod.key} uses {pod.used_memory_mib} MiB on card {shown.uuid} "
                            f"of node {name}; its share is {pod.memory_mib} MiB",
                            node=name,
                            uuid=shown.uuid,
                            pod=pod.key,
                        )
                    )
    usage_state = UsageState.OFF
    usage_error = ""
    if result is not None:
        usage_state = UsageState.OK if result.usage is not None else UsageState.UNAVAILABLE
        usage_error = result.error
    unplaced_tuple = tuple(unplaced)
    return NodeView(
        name=name,
        address=node_address(item.json),
        inventory=state,
        cards=tuple(cards),
        unplaced=unplaced_tuple,
        totals=_node_totals(cards, unplaced_tuple, assumed, advertised if inventory is None else 0),
        advertised_gpus=advertised,
        inventory_error=item.info.inventory_error,
        usage=usage_state,
        usage_error=usage_error,
    )


def _kubelet_cards(
    facts: PodFacts, usage: NodeUsage | None, records: Mapping[str, GpuRecord]
) -> list[GpuRecord]:
    """The node's published cards the kubelet says the pod holds (lowest index first, at most
    as many as it asks for); none when usage was not fetched or does not mention the pod."""
    if usage is None:
        return []
    reported = usage.pod_cards.get((facts.namespace, facts.name), frozenset())
    known = sorted((records[u] for u in reported if u in records), key=lambda r: r.index)
    return known[: facts.whole_gpus]


def _card_warnings(node: str, cards: Iterable[CardView], warnings: list[DriftWarning]) -> None:
    for card in cards:
        if card.overcommitted:
            warnings.append(
                DriftWarning(
                    WarningKind.OVERCOMMITTED_CARD,
                    f"node {node} card {card.index} ({card.uuid}): "
                    f"{card.allocated_memory_mib}/{card.memory_mib} MiB and "
                    f"{card.allocated_compute_milli}/{MILLI_PER_GPU} milli allocated "
                    f"to {', '.join(p.key for p in card.pods)}",
                    node=node,
                    uuid=card.uuid,
                )
            )
        if not card.healthy and card.pods:
            warnings.append(
                DriftWarning(
                    WarningKind.UNHEALTHY_CARD_IN_USE,
                    f"node {node} card {card.index} ({card.uuid}) is unhealthy and still "
                    f"holds {', '.join(p.key for p in card.pods)}",
                    node=node,
                    uuid=card.uuid,
                )
            )


def _node_totals(
    cards: Collection[CardView],
    unplaced: Collection[UnplacedPod],
    assumed_taken: Collection[str],
    advertised_only: int,
) -> Totals:
    readings = [c.used_memory_mib for c in cards if c.used_memory_mib is not None]
    open_cards = [
        c
        for c in cards
        if c.healthy and c.uuid not in assumed_taken and c.allocated_compute_milli < MILLI_PER_GPU
    ]
    pods = {p.key for c in cards for p in c.pods} | {u.key for u in unplaced}
    return Totals(
        nodes=1,
        gpus=len(cards) or advertised_only,
        healthy_gpus=sum(1 for c in cards if c.healthy) if cards else advertised_only,
        memory_mib=sum(c.memory_mib for c in cards),
        allocated_memory_mib=sum(c.allocated_memory_mib for c in cards)
        + sum(u.memory_mib for u in unplaced),
        allocated_compute_milli=sum(c.allocated_compute_milli for c in cards)
        + sum(u.compute_milli for u in unplaced),
        free_gpus=sum(
            1 for c in open_cards if c.allocated_memory_mib == 0 and c.allocated_compute_milli == 0
        )
        if cards
        else max(0, advertised_only - sum(u.whole_gpus for u in unplaced)),
        largest_free_memory_mib=max((c.free_memory_mib for c in open_cards), default=0),
        unplaced_whole_gpus=sum(u.whole_gpus for u in unplaced),
        used_memory_mib=sum(readings) if readings else None,
        pods=len(pods),
    )


def sum_totals(views: Iterable[NodeView]) -> Totals:
    views = list(views)
    readings = [v.totals.used_memory_mib for v in views if v.totals.used_memory_mib is not None]
    return Totals(
        nodes=len(views),
        gpus=sum(v.totals.gpus for v in views),
        healthy_gpus=sum(v.totals.healthy_gpus for v in views),
        memory_mib=sum(v.totals.memory_mib for v in views),
        allocated_memory_mib=sum(v.totals.allocated_memory_mib for v in views),
        allocated_compute_milli=sum(v.totals.allocated_compute_milli for v in views),
        free_gpus=sum(v.totals.free_gpus for v in views),
        largest_free_memory_mib=max((v.totals.largest_free_memory_mib for v in views), default=0),
        unplaced_whole_gpus=sum(v.totals.unplaced_whole_gpus for v in views),
        used_memory_mib=sum(readings) if readings else None,
        pods=sum(v.totals.pods for v in views),
    )
