"""The inspect report: every GPU node, its cards, the pods on each card, totals and drift.

:func:`build_report` is the whole computation, from the JSON of Nodes and Pods (what any
Kubernetes client lists) and optional exporter usage to frozen values. Cards come from the node
agent's inventory annotation; what a pod holds follows the rules of
the pod's claim (:func:`kubegpu.sharing.claim.read_claim`, the protocol's one reader, judged by
the rules of :func:`kubegpu.sharing.podstate.usage_of`), which is what the scheduler extender
charges. So inspect shows what the
scheduler believes, and flags where that belief and the cluster disagree (*drift warnings*).

Rules worth knowing:

* A pod bound without an allocation decision (a plain ``nvidia.com/gpu`` pod placed by another
  scheduler) holds whole cards we cannot name. It is listed under its node as *unplaced*, its
  compute counts in the node's totals, and its memory counts as the extender assumes (the
  highest-index cards still free); no card row claims it.
* ``--namespace`` narrows the pods listed, never the card figures: a card's free memory does not
  depend on who is looking.
* CPU-only nodes (no inventory, no advertised GPUs, no GPU pods) are counted, not listed.

Pure: no I/O, no clock (the caller passes ``generated_at``).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubegpu.inspect.usage import NodeUsage, UsageResult
from kubegpu.placement.model import MILLI_PER_GPU
from kubegpu.sharing.accounting import NodeInfo
from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    AllocationDecision,
    AnnotationError,
    CardShare,
    GpuRecord,
    decode_inventory,
)
from kubegpu.sharing.claim import (
    TERMINAL_PHASES,
    decided_elsewhere,
    mentions_gpu,
    read_claim,
    share_without_decision,
)
from kubegpu.sharing.resources import (
    RequestError,
    ResourceNames,
    parse_quantity,
)


class UsageState(enum.Enum):
    OFF = "off"  # not asked for
    OK = "ok"
    UNAVAILABLE = "unavailable"  # asked, no answer: shown as "?"


class InventoryState(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # the node agent has not published one
    INVALID = "invalid"  # published but unreadable


class PendingState(enum.Enum):
    BINDING = "binding"  # decided and recorded, not yet bound
    STARTING = "starting"  # bound with a decision, containers not started (no Allocate yet)
    UNSCHEDULED = "unscheduled"  # asks for GPUs, no node and no decision yet
    # The scheduler tried and said no (PodScheduled=False); it tries again when the cluster
    # changes. The demo summary and the scheduler stand-in call these pods "refused" too.
    REFUSED = "refused"


class UnplacedReason(enum.Enum):
    NO_DECISION = "no-decision"  # whole GPUs without an allocation annotation
    UNKNOWN_CARD = "unknown-card"  # the decision names a card the node does not publish
    NO_INVENTORY = "no-inventory"  # the node publishes no (readable) inventory


class PlacedBy(enum.Enum):
    """Who says which card a pod holds."""

    DECISION = "decision"  # the extender's allocation annotation
    # The node's kubelet (PodResources, read through the exporter): a whole-GPU pod the
    # extender never decided for, placed only when usage was fetched.
    KUBELET = "kubelet"


class WarningKind(enum.Enum):
    OVERCOMMITTED_CARD = "overcommitted-card"
    UNKNOWN_CARD = "unknown-card"
    UNHEALTHY_CARD_IN_USE = "unhealthy-card-in-use"
    DECISION_NODE_MISMATCH = "decision-node-mismatch"
    INDEX_MISMATCH = "index-mismatch"
    MALFORMED_ALLOCATION = "malformed-allocation"
    INVALID_INVENTORY = "invalid-inventory"
    MISSING_INVENTORY = "missing-inventory"
    SHARE_WITHOUT_DECISION = "share-without-decision"
    NOT_ENOUGH_FREE_CARDS = "not-enough-free-cards"
    OVER_SHARE = "over-share"
    UNREADABLE_POD = "unreadable-pod"


@dataclass(frozen=True)
class PodOnCard:
    """One pod's hold on one card (pod totals over its containers, as the extender charges)."""

    namespace: str
    name: str
    phase: str
    shared: bool
    memory_mib: int
    compute_milli: int
    bound: bool = True
    used_memory_mib: int | None = None  # from the exporter, when it reported this pod
    over_share: bool | None = None
    placed_by: PlacedBy = PlacedBy.DECISION

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class CardView:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    allocated_memory_mib: int
    allocated_compute_milli: int
    pods: tuple[PodOnCard, ...] = ()
    used_memory_mib: int | None = None
    utilization_ratio: float | None = None

    @property
    def free_memory_mib(self) -> int:
        return max(0, self.memory_mib - self.allocated_memory_mib)

    @property
    def overcommitted(self) -> bool:
        return (
            self.allocated_memory_mib > self.memory_mib
            or self.allocated_compute_milli > MILLI_PER_GPU
        )


@dataclass(frozen=True)
class UnplacedPod:
    """A pod charged to the node whose cards are unknown (see :class:`UnplacedReason`)."""

    namespace: str
    name: str
    phase: str
    reason: UnplacedReason
    whole_gpus: int
    compute_milli: int
    memory_mib: int  # what its decision says; for no-decision pods: the extender's assumption

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Totals:
    """Sums over cards (a node) or nodes (the cluster). ``gpus`` counts published cards, or
    the advertised ``nvidia.com/gpu`` count where no inventory is published."""

    nodes: int
    gpus: int
    healthy_gpus: int
    memory_mib: int
    allocated_memory_mib: int
    allocated_compute_milli: int
    free_gpus: int  # healthy cards with nothing allocated
    largest_free_memory_mib: int  # the biggest share one healthy card can still take
    unplaced_whole_gpus: int
    used_memory_mib: int | None = None  # sum over cards with a reading; None: no reading
    pods: int = 0


@dataclass(frozen=True)
class NodeView:
    name: str
    address: str
    inventory: InventoryState
    cards: tuple[CardView, ...]
    unplaced: tuple[UnplacedPod, ...]
    totals: Totals
    advertised_gpus: int = 0
    inventory_error: str = ""
    usage: UsageState = UsageState.OFF
    usage_error: str = ""


@dataclass(frozen=True)
class PendingCard:
    uuid: str
    index: int
    memory_mib: int
    compute_milli: int


@dataclass(frozen=True)
class PendingPod:
    namespace: str
    name: str
    state: PendingState
    node: str  # the decided (or bound) node; empty while unscheduled
    whole_gpus: int
    memory_mib: int  # shared requests: MiB asked for on one card
    compute_milli: int
    cards: tuple[PendingCard, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class DriftWarning:
    kind: WarningKind
    message: str
    node: str = ""
    uuid: str = ""
    pod: str = ""  # namespace/name


@dataclass(frozen=True)
class Filters:
    nodes: tuple[str, ...] = ()
    namespace: str = ""


@dataclass(frozen=True)
class InspectReport:
    generated_at: str
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingPod, ...]
    warnings: tuple[DriftWarning, ...]
    totals: Totals
    filters: Filters = Filters()
    cpu_only_nodes: int = 0
    usage: UsageState = UsageState.OFF


# --------------------------------------------------------------------------- reading JSON
def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _node_address(node: Mapping[str, Any]) -> str:
    status = node.get("status")
    addresses = status.get("addresses") if isinstance(status, Mapping) else None
    found: dict[str, str] = {}
    for item in addresses if isinstance(addresses, list) else []:
        if isinstance(item, Mapping) and isinstance(item.get("address"), str):
            found.setdefault(str(item.get("type")), item["address"])
    for kind in ("InternalIP", "ExternalIP", "Hostname"):
        if kind in found:
            return found[kind]
    return str(_meta(node).get("name") or "")


def node_address(node: Mapping[str, Any]) -> str:
    """Where the node's exporter is reached: InternalIP, else ExternalIP, else hostname."""
    return _node_address(node)


def _allocatable(node: Mapping[str, Any], name: str) -> int:
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping) or name not in allocatable:
        return 0
    try:
        return int(parse_quantity(allocatable[name]))
    except RequestError:
        return 0


def _node_inventory(node: Mapping[str, Any]) -> NodeInfo:
    name = str(_meta(node).get("name") or "")
    annotations = _meta(node).get("annotations")
    raw = annotations.get(INVENTORY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is None:
        return NodeInfo(name, 0, 0)
    try:
        return NodeInfo(name, 0, 0, decode_inventory(raw))
    except AnnotationError as exc:
        return NodeInfo(name, 0, 0, None, str(exc))


def _refused(pod: Mapping[str, Any]) -> bool:
    """Whether the scheduler has tried the pod and found no node (PodScheduled=False)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in conditions
    )


def _phase(pod: Mapping[str, Any]) -> str:
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase if isinstance(phase, str) and phase else "Pending"


def _started(pod: Mapping[str, Any], phase: str) -> bool:
    """Whether the kubelet has started the pod (so its device Allocate has happened)."""
    if phase != "Pending":
        return True
    status = pod.get("status")
    statuses = status.get("containerStatuses") if isinstance(status, Mapping) else None
    for item in statuses if isinstance(statuses, list) else []:
        state = item.get("state") if isinstance(item, Mapping) else None
        if isinstance(state, Mapping) and ("running" in state or "terminated" in state):
            return True
    return False


def gpu_node_names(
    nodes: Iterable[Mapping[str, Any]],
    filters: Filters = Filters(),
    names: ResourceNames | None = None,
) -> list[str]:
    """Nodes worth asking for usage: they publish an inventory or advertise GPUs, and pass
    the node filter. Cheap (no annotation is parsed), so usage can be fetched before the
    report is built."""
    names = names or ResourceNames()
    wanted = set(filters.nodes)
    found: list[str] = []
    for node in nodes:
        meta = _meta(node)
        name = meta.get("name")
        if not isinstance(name, str) or not name or (wanted and name not in wanted):
            continue
        annotations = meta.get("annotations")
        published = isinstance(annotations, Mapping) and INVENTORY_ANNOTATION in annotations
        if published or _allocatable(node, names.whole_gpu) or _allocatable(node, names.share_slot):
            found.append(name)
    return found


# --------------------------------------------------------------------------- building
@dataclass
class _PodFacts:
    namespace: str
    name: str
    phase: str
    node: str  # where it is charged
    bound: bool
    decision: AllocationDecision | None
    whole_gpus: int
    compute_milli: int
    gpu_memory_mib: int


@dataclass(frozen=True)
class _PodReading:
    facts: _PodFacts | None
    warnings: tuple[DriftWarning, ...]
    pending: tuple[PendingPod, ...]


@dataclass
class ReadCache:
    """Per-object readings keyed by (uid or name, resourceVersion): a watch re-renders after
    one event without re-parsing every annotation in the cluster. Objects without a
    resourceVersion are never cached."""

    nodes: dict[tuple[str, str], NodeInfo] = field(default_factory=dict)
    pods: dict[tuple[str, str], _PodReading] = field(default_factory=dict)


def _version_key(obj: Mapping[str, Any], id_field: str) -> tuple[str, str] | None:
    meta = _meta(obj)
    ident, version = meta.get(id_field), meta.get("resourceVersion")
    if isinstance(ident, str) and ident and isinstance(version, str) and version:
        return ident, version
    return None


@dataclass
class _NodeWork:
    json: Mapping[str, Any]
    info: NodeInfo
    pods: list[_PodFacts] = field(default_factory=list)


def build_report(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    usage: Mapping[str, UsageResult] | None = None,
    *,
    filters: Filters = Filters(),
    names: ResourceNames | None = None,
    generated_at: str = "",
    cache: ReadCache | None = None,
) -> InspectReport:
    """The report for ``nodes`` and ``pods`` (Kubernetes JSON, as listed). ``usage`` maps node
    names to what their exporter answered; ``None`` means usage was not asked for. ``cache``
    (watch mode) reuses the readings of objects whose resourceVersion has not changed."""
    names = names or ResourceNames()
    warnings: list[DriftWarning] = []
    work: dict[str, _NodeWork] = {}
    memo = cache if cache is not None else ReadCache()
    node_memo: dict[tuple[str, str], NodeInfo] = {}
    for node in nodes:
        key = _version_key(node, "name")
        info = memo.nodes.get(key) if key else None
        if info is None:
            info = _node_inventory(node)
        if key:
            node_memo[key] = info
        if info.name:
            work[info.name] = _NodeWork(node, info)
    pending: list[PendingPod] = []
    pod_memo: dict[tuple[str, str], _PodReading] = {}
    for pod in pods:
        key = _version_key(pod, "uid")
        reading = memo.pods.get(key) if key else None
        if reading is None:
            found: list[DriftWarning] = []
            waiting: list[PendingPod] = []
            reading = _PodReading(
                _read_pod(pod, names, found, waiting), tuple(found), tuple(waiting)
            )
        if key:
            pod_memo[key] = reading
        warnings.extend(reading.warnings)
        pending.extend(reading.pending)
        facts = reading.facts
        if facts is not None and facts.node in work:
            work[facts.node].pods.append(facts)
        elif facts is not None:
            warnings.append(
                DriftWarning(
                    WarningKind.DECISION_NODE_MISMATCH,
                    f"pod {facts.namespace}/{facts.name} is charged to node {facts.node}, "
                    "which does not exist",
                    node=facts.node,
                    pod=f"{facts.namespace}/{facts.name}",
                )
            )

    views: list[NodeView] = []
    cpu_only = 0
    for name in sorted(work):
        item = work[name]
        advertised = _allocatable(item.json, names.whole_gpu) + _allocatable(
            item.json, names.share_slot
        )
        has_gpu_facts = (
            item.info.inventory is not None
            or bool(item.info.inventory_error)
            or advertised > 0
            or bool(item.pods)
        )
        if not has_gpu_facts:
            cpu_only += 1
            continue
        node_usage = None if usage is None else usage.get(name)
        views.append(
            _node_view(item, _allocatable(item.json, names.whole_gpu), node_usage, warnings)
        )

    memo.nodes, memo.pods = node_memo, pod_memo  # forget objects no longer listed
    report_usage = UsageState.OFF if usage is None else UsageState.OK
    return _filtered(
        InspectReport(
            generated_at=generated_at,
            nodes=tuple(views),
            pending=tuple(sorted(pending, key=lambda p: (p.state.value, p.namespace, p.name))),
            warnings=tuple(warnings),
            totals=_sum_totals(views),
            filters=filters,
            cpu_only_nodes=cpu_only,
            usage=report_usage,
        )
    )


def _read_pod(
    pod: Mapping[str, Any],
    names: ResourceNames,
    warnings: list[DriftWarning],
    pending: list[PendingPod],
) -> _PodFacts | None:
    phase = _phase(pod)
    if phase in TERMINAL_PHASES or not mentions_gpu(pod, names):
        return None  # most pods of a cluster: skip the full request arithmetic
    claim = read_claim(pod, names)
    key, namespace, name = claim.key, claim.namespace, claim.name
    if claim.decision_problem:
        warnings.append(
            DriftWarning(WarningKind.MALFORMED_ALLOCATION, claim.decision_problem, pod=key)
        )
    totals = claim.totals
    if totals is None:
        warnings.append(
            DriftWarning(WarningKind.UNREADABLE_POD, f"{claim.refusal}; not charged", pod=key)
        )
        return None
    decision = claim.decision
    wants_gpu = totals.whole_gpus > 0 or totals.compute_milli > 0 or totals.gpu_memory_mib > 0
    bound_to = claim.node
    if not wants_gpu and decision is None and not claim.elsewhere:
        return None
    if not bound_to and decision is None:
        pending.append(
            PendingPod(
                namespace,
                name,
                PendingState.REFUSED if _refused(pod) else PendingState.UNSCHEDULED,
                "",
                totals.whole_gpus,
                totals.gpu_memory_mib,
                totals.compute_milli,
            )
        )
        return None
    if claim.elsewhere:
        warnings.append(
            DriftWarning(
                WarningKind.DECISION_NODE_MISMATCH,
                decided_elsewhere(key, claim.elsewhere, bound_to),
                node=bound_to,
                pod=key,
            )
        )
    if bound_to and decision is None and (totals.compute_milli or totals.gpu_memory_mib):
        warnings.append(
            DriftWarning(
                WarningKind.SHARE_WITHOUT_DECISION,
                share_without_decision(key, bound_to),
                node=bound_to,
                pod=key,
            )
        )
    # What the pod holds, by podstate.read_pod's rules (the extender's), without reading the
    # pod a second time: its decision's cards, else (bound, no usable decision) whole GPUs
    # on cards nobody recorded.
    if decision is not None and (not bound_to or not _started(pod, phase)):
        pending.append(
            PendingPod(
                namespace,
                name,
                PendingState.BINDING if not bound_to else PendingState.STARTING,
                decision.node,
                0 if decision.shared else len(decision.cards),
                sum(c.gpu_memory_mib for c in decision.cards) if decision.shared else 0,
                sum(c.compute_milli for c in decision.cards) if decision.shared else 0,
                tuple(
                    PendingCard(c.uuid, c.index, c.gpu_memory_mib, c.compute_milli)
                    for c in decision.cards
                ),
            )
        )
    return _PodFacts(
        namespace,
        name,
        phase,
        bound_to or (decision.node if decision is not None else ""),
        bool(bound_to),
        decision,
        totals.whole_gpus if decision is None else 0,
        totals.compute_milli,
        totals.gpu_memory_mib,
    )


def _node_view(
    item: _NodeWork,
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
    undecided: list[_PodFacts] = []
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
        address=_node_address(item.json),
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
    facts: _PodFacts, usage: NodeUsage | None, records: Mapping[str, GpuRecord]
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


def _sum_totals(views: Iterable[NodeView]) -> Totals:
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


# --------------------------------------------------------------------------- filters
def _filtered(report: InspectReport) -> InspectReport:
    """Apply ``report.filters``: nodes by name, pods by namespace (card figures untouched)."""
    wanted_nodes = set(report.filters.nodes)
    namespace = report.filters.namespace
    if not wanted_nodes and not namespace:
        return report
    nodes: list[NodeView] = []
    for view in report.nodes:
        if wanted_nodes and view.name not in wanted_nodes:
            continue
        if namespace:
            cards = tuple(
                _replace_pods(c, tuple(p for p in c.pods if p.namespace == namespace))
                for c in view.cards
            )
            unplaced = tuple(u for u in view.unplaced if u.namespace == namespace)
            # A node with none of the namespace's pods stays: its free cards are what that
            # namespace's next pod could get, and hiding it could leave "no GPU nodes match".
            view = _replace_node(view, cards, unplaced)
        nodes.append(view)
    shown = {v.name for v in nodes}

    def keep_pod(pod: str) -> bool:
        return not namespace or pod.partition("/")[0] == namespace

    pending = tuple(
        p
        for p in report.pending
        if (not wanted_nodes or p.node in wanted_nodes) and keep_pod(p.key)
    )
    warnings = tuple(
        w
        for w in report.warnings
        if (not wanted_nodes or w.node in wanted_nodes)
        and (keep_pod(w.pod) if w.pod else (not namespace or w.node in shown))
    )
    return InspectReport(
        generated_at=report.generated_at,
        nodes=tuple(nodes),
        pending=pending,
        warnings=warnings,
        totals=_sum_totals(nodes),
        filters=report.filters,
        cpu_only_nodes=0 if wanted_nodes else report.cpu_only_nodes,
        usage=report.usage,
    )


def _replace_pods(card: CardView, pods: tuple[PodOnCard, ...]) -> CardView:
    return replace(card, pods=pods)


def _replace_node(
    view: NodeView, cards: tuple[CardView, ...], unplaced: tuple[UnplacedPod, ...]
) -> NodeView:
    pods = {p.key for c in cards for p in c.pods} | {u.key for u in unplaced}
    return replace(
        view, cards=cards, unplaced=unplaced, totals=replace(view.totals, pods=len(pods))
    )
