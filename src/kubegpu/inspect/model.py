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
* Cards in MIG mode (under the device plugin's ``single`` or ``mixed``) are not in the
  inventory; :mod:`kubegpu.inspect.mig` adds them to their node with their MIG devices and the
  pods holding them. Under ``single`` a plain ``nvidia.com/gpu`` pod on such a node holds MIG
  devices, not whole cards, and is listed there.

The values live in :mod:`kubegpu.inspect.report`, the JSON accessors in
:mod:`kubegpu.inspect.reading` and one node's cards, warnings and totals in
:mod:`kubegpu.inspect.node_view`; this module reads the pods, assembles the report and applies
its filters.

Pure: no I/O, no clock (the caller passes ``generated_at``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubegpu.inspect.mig import (
    MigPodFacts,
    NodeMig,
    bound_node,
    mig_in_namespace,
    mig_pod_facts,
    node_pod_keys,
    read_node_mig,
    with_mig,
)
from kubegpu.inspect.node_view import NodeWork, PodFacts, node_view, sum_totals
from kubegpu.inspect.reading import (
    allocatable_count,
    node_inventory,
    pod_phase,
    pod_started,
    refused_by_scheduler,
    version_key,
)
from kubegpu.inspect.report import (
    CardView,
    DriftWarning,
    Filters,
    InspectReport,
    NodeView,
    PendingCard,
    PendingPod,
    PendingState,
    PodOnCard,
    UnplacedPod,
    UsageState,
    WarningKind,
)
from kubegpu.inspect.usage import UsageResult
from kubegpu.sharing.accounting import NodeInfo
from kubegpu.sharing.claim import (
    TERMINAL_PHASES,
    decided_elsewhere,
    mentions_gpu,
    read_claim,
    share_without_decision,
)
from kubegpu.sharing.resources import ResourceNames


# --------------------------------------------------------------------------- building
@dataclass(frozen=True)
class _PodReading:
    facts: PodFacts | None
    warnings: tuple[DriftWarning, ...]
    pending: tuple[PendingPod, ...]


@dataclass
class ReadCache:
    """Per-object readings keyed by (uid or name, resourceVersion): a watch re-renders after
    one event without re-parsing every annotation in the cluster. Objects without a
    resourceVersion are never cached."""

    nodes: dict[tuple[str, str], NodeInfo] = field(default_factory=dict)
    pods: dict[tuple[str, str], _PodReading] = field(default_factory=dict)
    mig: dict[tuple[str, str], NodeMig] = field(default_factory=dict)


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
    work: dict[str, NodeWork] = {}
    memo = cache if cache is not None else ReadCache()
    node_memo: dict[tuple[str, str], NodeInfo] = {}
    mig_memo: dict[tuple[str, str], NodeMig] = {}
    migs: dict[str, NodeMig] = {}
    for node in nodes:
        key = version_key(node, "name")
        info = memo.nodes.get(key) if key else None
        if info is None:
            info = node_inventory(node)
        mig = memo.mig.get(key) if key else None
        if mig is None:
            mig = read_node_mig(node)
        if key:
            node_memo[key] = info
            mig_memo[key] = mig
        if info.name:
            work[info.name] = NodeWork(node, info)
            migs[info.name] = mig
    mig_pods: dict[str, list[MigPodFacts]] = {}
    pending: list[PendingPod] = []
    pod_memo: dict[tuple[str, str], _PodReading] = {}
    for pod in pods:
        key = version_key(pod, "uid")
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
        bound_to = bound_node(pod)
        mig = migs.get(bound_to)
        if mig is not None and mig.devices is not None:
            asked = mig_pod_facts(pod, pod_phase(pod), mig)
            if asked is not None:
                mig_pods.setdefault(bound_to, []).append(asked)
        if facts is None or _holds_mig_devices(facts, migs, names):
            continue  # such a whole-GPU pod is listed with the MIG devices, not on cards
        if facts.node in work:
            work[facts.node].pods.append(facts)
        else:
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
        advertised = allocatable_count(item.json, names.whole_gpu) + allocatable_count(
            item.json, names.share_slot
        )
        mig = migs[name]
        has_gpu_facts = (
            item.info.inventory is not None
            or bool(item.info.inventory_error)
            or advertised > 0
            or bool(item.pods)
            or mig.devices is not None
            or bool(mig.error)
        )
        if not has_gpu_facts:
            cpu_only += 1
            continue
        node_usage = None if usage is None else usage.get(name)
        view = node_view(item, allocatable_count(item.json, names.whole_gpu), node_usage, warnings)
        measured = node_usage.usage if node_usage is not None else None
        views.append(with_mig(view, mig, mig_pods.get(name, []), measured, warnings))

    # forget objects no longer listed
    memo.nodes, memo.pods, memo.mig = node_memo, pod_memo, mig_memo
    report_usage = UsageState.OFF if usage is None else UsageState.OK
    return _filtered(
        InspectReport(
            generated_at=generated_at,
            nodes=tuple(views),
            pending=tuple(sorted(pending, key=lambda p: (p.state.value, p.namespace, p.name))),
            warnings=tuple(warnings),
            totals=sum_totals(views),
            filters=filters,
            cpu_only_nodes=cpu_only,
            usage=report_usage,
        )
    )


def _holds_mig_devices(facts: PodFacts, migs: Mapping[str, NodeMig], names: ResourceNames) -> bool:
    """Whether a whole-GPU pod without a decision is bound to a node whose MIG devices go by the
    whole-GPU resource (``single``): it holds MIG devices then, not cards."""
    mig = migs.get(facts.node)
    return (
        facts.bound
        and facts.decision is None
        and mig is not None
        and names.whole_gpu in mig.resources
    )


def _read_pod(
    pod: Mapping[str, Any],
    names: ResourceNames,
    warnings: list[DriftWarning],
    pending: list[PendingPod],
) -> PodFacts | None:
    phase = pod_phase(pod)
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
                PendingState.REFUSED if refused_by_scheduler(pod) else PendingState.UNSCHEDULED,
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
    if decision is not None and (not bound_to or not pod_started(pod, phase)):
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
    return PodFacts(
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
            view = _replace_node(mig_in_namespace(view, namespace), cards, unplaced)
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
        totals=sum_totals(nodes),
        filters=report.filters,
        cpu_only_nodes=0 if wanted_nodes else report.cpu_only_nodes,
        usage=report.usage,
    )


def _replace_pods(card: CardView, pods: tuple[PodOnCard, ...]) -> CardView:
    return replace(card, pods=pods)


def _replace_node(
    view: NodeView, cards: tuple[CardView, ...], unplaced: tuple[UnplacedPod, ...]
) -> NodeView:
    narrowed = replace(view, cards=cards, unplaced=unplaced)
    return replace(narrowed, totals=replace(view.totals, pods=len(node_pod_keys(narrowed))))
