"""A pod's GPU claim: the one owner of the allocation protocol.

Three parties write what one pod holds, each on the pod itself (so that every party, restarted,
reads the same state back):

* the scheduler extender *decides* the cards at bind time (``kubegpu.io/gpu-allocation``);
* the node agent *grants* each sharing container its share when the kubelet calls ``Allocate``
  (``kubegpu.io/gpu-allocated``), and *reconciles* decision and grants with what the kubelet
  really handed out (``kubegpu.io/gpu-drift`` and ``kubegpu.io/gpu-share-mismatch`` say what it
  repaired);
* the extender *releases* a decision whose Binding failed.

:class:`PodClaim` is all of that as one frozen value: what the pod asks for, what was decided,
what was granted, and the phase that follows from them. :func:`read_claim` is the only reader of
a pod's GPU resources and of those annotations (through their codecs:
:mod:`~kubegpu.sharing.annotations`, :mod:`~kubegpu.sharing.ledger`,
:mod:`~kubegpu.sharing.findings`); :func:`decide`, :func:`release`, :func:`grant` and
:func:`reconcile` are the transitions, and :func:`annotation_patch` the only writer, turning a
transition into the merge patch that records it. :func:`device_requests` reads, by the same
arithmetic, what a pod asks of devices outside the protocol (MIG devices, which kube-scheduler
places alone). Pure: pod JSON in, values and patches out.
docs/allocation-protocol.md draws the whole protocol.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    AnnotationError,
    decode_allocation,
    encode_allocation,
)
from kubegpu.sharing.findings import (
    DRIFT_ANNOTATION,
    MISMATCH_ANNOTATION,
    Findings,
    decode_findings,
    encode_findings,
)
from kubegpu.sharing.ledger import (
    ALLOCATED_ANNOTATION,
    GrantedContainer,
    Ledger,
    LedgerError,
    decode_ledger,
    encode_ledger,
)
from kubegpu.sharing.resources import (
    GpuRequest,
    PodTotals,
    RequestError,
    ResourceNames,
    parse_quantity,
    pod_key,
    pod_totals,
    request_from_totals,
)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class ClaimPhase(enum.Enum):
    """Where a pod stands in the protocol (derived, never stored)."""

    NONE = "none"  # asks for no GPU and holds no decision
    UNREADABLE = "unreadable"  # its resources cannot be read: nothing can be charged
    ASKING = "asking"  # asks for a GPU; nothing decided, not bound
    DECIDED = "decided"  # the extender's decision is recorded; the Binding is not seen yet
    BOUND = "bound"  # bound to the node its decision names
    GRANTED = "granted"  # bound, and the node agent granted every share it decided
    UNRECORDED = "unrecorded"  # bound with a GPU request but no usable decision
    RELEASED = "released"  # terminated: holds nothing


class ClaimError(ValueError):
    """A transition that the claim's phase does not allow."""


@dataclass(frozen=True)
class PodClaim:
    """One pod's GPU claim. ``totals`` is ``None`` when its resources do not parse (``refusal``
    says why); ``request`` is ``None`` when they parse but cannot be served (``refusal`` again).
    ``decision`` is the recorded decision when it is usable: one naming another node than the
    pod is bound to is dropped, and ``problems`` says so (as it reports malformed annotations).
    ``recorded``: the allocation annotation is present, parsable or not."""

    uid: str
    namespace: str
    name: str
    node: str  # spec.nodeName; "" until bound
    pod_phase: str  # status.phase; "" when absent
    created: str = ""
    resource_version: str = ""
    totals: PodTotals | None = None
    request: GpuRequest | None = None
    refusal: str = ""
    decision: AllocationDecision | None = None
    recorded: bool = False
    ledger: Ledger | None = None
    drift: Findings | None = None
    mismatch: Findings | None = None
    decision_problem: str = ""  # the allocation annotation does not parse
    elsewhere: str = ""  # the node a dropped decision named (the pod is bound to another)
    ledger_problem: str = ""  # the ledger annotation does not parse
    init_containers: frozenset[str] = frozenset()  # sidecars included
    sidecars: frozenset[str] = frozenset()  # init containers with restartPolicy: Always

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def problems(self) -> tuple[str, ...]:
        """Everything worth a log line, in one wording per problem."""
        elsewhere = decided_elsewhere(self.key, self.elsewhere, self.node) if self.elsewhere else ""
        return tuple(p for p in (self.decision_problem, elsewhere, self.ledger_problem) if p)

    @property
    def problem(self) -> str:
        return "; ".join(self.problems)

    @property
    def terminal(self) -> bool:
        return self.pod_phase in TERMINAL_PHASES

    @property
    def asks_gpu(self) -> bool:
        t = self.totals
        return t is not None and bool(
            t.whole_gpus or t.compute_milli or t.gpu_memory_mib or t.share_slots
        )

    @property
    def phase(self) -> ClaimPhase:
        if self.terminal:
            return ClaimPhase.RELEASED
        if self.totals is None:
            return ClaimPhase.UNREADABLE
        if self.decision is None:
            if not self.asks_gpu:
                return ClaimPhase.NONE
            return ClaimPhase.UNRECORDED if self.node else ClaimPhase.ASKING
        if not self.node:
            return ClaimPhase.DECIDED
        if self.decision.shared and self.ledger is not None:
            wanted = {c.name for c in self.decision.containers}
            if wanted and wanted <= self.ledger.names():
                return ClaimPhase.GRANTED
        return ClaimPhase.BOUND


# --------------------------------------------------------------------------- the one reader
def read_claim(pod: Mapping[str, Any], names: ResourceNames | None = None) -> PodClaim:
    """Everything the protocol knows about ``pod`` (Kubernetes JSON). Never raises: what cannot
    be read is reported in ``problems`` / ``refusal`` and treated as absent."""
    names = names or ResourceNames()
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    status = _mapping(pod.get("status"))
    annotations = _mapping(meta.get("annotations"))
    key = pod_key(pod)

    recorded = ALLOCATION_ANNOTATION in annotations
    decision, decision_problem = read_decision(pod)
    node = spec.get("nodeName")
    node = node if isinstance(node, str) else ""
    elsewhere = ""
    if decision is not None and node and decision.node != node:
        elsewhere, decision = decision.node, None

    ledger: Ledger | None = None
    ledger_problem = ""
    if ALLOCATED_ANNOTATION in annotations:
        try:
            ledger = decode_ledger(annotations[ALLOCATED_ANNOTATION])
        except LedgerError as exc:
            ledger_problem = f"pod {key}: {exc}; treated as nothing allocated"

    totals: PodTotals | None = None
    request: GpuRequest | None = None
    refusal = ""
    try:
        totals = pod_totals(pod, names)
        request = request_from_totals(pod, totals, names)
    except RequestError as exc:
        refusal = str(exc)

    init = [c for c in spec.get("initContainers") or [] if isinstance(c, Mapping)]
    phase = status.get("phase")
    return PodClaim(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node=node,
        pod_phase=phase if isinstance(phase, str) else "",
        created=str(meta.get("creationTimestamp") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        totals=totals,
        request=request,
        refusal=refusal,
        decision=decision,
        recorded=recorded,
        ledger=ledger,
        drift=decode_findings(annotations.get(DRIFT_ANNOTATION)),
        mismatch=decode_findings(annotations.get(MISMATCH_ANNOTATION)),
        decision_problem=decision_problem,
        elsewhere=elsewhere,
        ledger_problem=ledger_problem,
        init_containers=frozenset(str(c.get("name")) for c in init),
        sidecars=frozenset(str(c.get("name")) for c in init if c.get("restartPolicy") == "Always"),
    )


def read_decision(pod: Mapping[str, Any]) -> tuple[AllocationDecision | None, str]:
    """The pod's recorded decision as written, whatever node it names, or ``None`` and why not
    (empty when simply absent)."""
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    if ALLOCATION_ANNOTATION not in annotations:
        return None, ""
    try:
        return decode_allocation(annotations[ALLOCATION_ANNOTATION]), ""
    except AnnotationError as exc:
        return None, f"pod {pod_key(pod)}: {exc}; treated as having no decision"


def decided_elsewhere(key: str, decided: str, bound: str) -> str:
    """The one wording of a decision naming another node than the pod is bound to."""
    return (
        f"pod {key}: allocation names node {decided} but the pod is bound to {bound}; "
        "its cards are unknown"
    )


def decided_for_another_node(key: str, decided: str, reader: str) -> str:
    """The one wording of a decision a node agent finds for another node than its own."""
    return f"pod {key}: allocation names node {decided}, not {reader}; not served here"


def share_without_decision(key: str, node: str) -> str:
    """The one wording of a shared pod bound without a decision."""
    return (
        f"pod {key}: bound to {node} with a GPU share but no allocation annotation; the node "
        "agent refuses it and it holds no card"
    )


def mentions_gpu(pod: Mapping[str, Any], names: ResourceNames) -> bool:
    """Whether the pod could claim anything: a container names a GPU resource or an allocation
    is recorded. A cheap pre-check for readers of whole clusters that skip CPU-only pods."""
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    if ALLOCATION_ANNOTATION in annotations:
        return True
    spec = _mapping(pod.get("spec"))
    wanted = names.all + names.peer_memory
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or ():
            resources = _mapping(
                container.get("resources") if isinstance(container, Mapping) else None
            )
            for part in ("limits", "requests"):
                amounts = resources.get(part)
                if isinstance(amounts, Mapping) and any(n in amounts for n in wanted):
                    return True
    return False


def device_requests(pod: Mapping[str, Any], resources: Collection[str]) -> dict[str, int]:
    """The pod's effective request of each of ``resources`` (extended resources another plan
    hands out, such as MIG devices), by kube-scheduler's arithmetic: app containers and
    sidecars add up, an init container counts alone beside the sidecars started before it.
    Only the positive ones; tolerant: an amount that does not parse counts as none (the API
    server would not have admitted it)."""
    if not resources:
        return {}
    spec = _mapping(pod.get("spec"))

    def amounts(container: object) -> dict[str, int]:
        res = _mapping(container.get("resources") if isinstance(container, Mapping) else None)
        limits, requests = _mapping(res.get("limits")), _mapping(res.get("requests"))
        found: dict[str, int] = {}
        for name in resources:
            raw = requests.get(name, limits.get(name))
            try:
                found[name] = int(parse_quantity(raw)) if raw is not None else 0
            except RequestError:
                found[name] = 0
        return found

    def items(group: str) -> list[object]:
        listed = spec.get(group)
        return listed if isinstance(listed, list) else []

    totals = dict.fromkeys(resources, 0)
    peak = dict.fromkeys(resources, 0)
    sidecars = dict.fromkeys(resources, 0)
    for container in items("initContainers"):
        asked = amounts(container)
        if _mapping(container).get("restartPolicy") == "Always":
            for name in resources:
                sidecars[name] += asked[name]
                totals[name] += asked[name]
                peak[name] = max(peak[name], sidecars[name])
        else:
            for name in resources:
                peak[name] = max(peak[name], asked[name] + sidecars[name])
    for container in items("containers"):
        asked = amounts(container)
        for name in resources:
            totals[name] += asked[name]
    effective = {name: max(totals[name], peak[name]) for name in resources}
    return {name: count for name, count in effective.items() if count > 0}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --------------------------------------------------------------------------- transitions
def decide(claim: PodClaim, decision: AllocationDecision) -> PodClaim:
    """The extender's decision, to be recorded before the Binding is posted."""
    if claim.node:
        raise ClaimError(f"pod {claim.key} is already bound to {claim.node}")
    return replace(claim, decision=decision, recorded=True)


def release(claim: PodClaim) -> PodClaim:
    """The decision withdrawn (its Binding failed): the cards are free again."""
    return replace(claim, decision=None, recorded=False)


def grant(claim: PodClaim, granted: GrantedContainer, node: str) -> PodClaim:
    """The node agent handed ``granted`` out to one of the pod's containers."""
    ledger = claim.ledger if claim.ledger is not None else Ledger(node)
    return replace(claim, ledger=ledger.with_container(granted))


def reconcile(
    claim: PodClaim,
    *,
    decision: AllocationDecision | None = None,
    ledger: Ledger | None = None,
    drift: Findings | None = None,
    mismatch: Findings | None = None,
) -> PodClaim:
    """Records rewritten to what the kubelet really handed out (``None``: kept as they are),
    with the findings that say what was repaired."""
    return replace(
        claim,
        decision=decision if decision is not None else claim.decision,
        recorded=claim.recorded or decision is not None,
        ledger=ledger if ledger is not None else claim.ledger,
        drift=drift if drift is not None else claim.drift,
        mismatch=mismatch if mismatch is not None else claim.mismatch,
    )


def annotation_patch(before: PodClaim, after: PodClaim) -> dict[str, str | None]:
    """The annotations to merge onto the pod to take it from ``before`` to ``after`` (``None``
    removes one): the only code that writes the protocol's annotations."""
    patch: dict[str, str | None] = {}
    if (after.decision, after.recorded) != (before.decision, before.recorded):
        patch[ALLOCATION_ANNOTATION] = (
            encode_allocation(after.decision) if after.decision is not None else None
        )
    if after.ledger != before.ledger:
        patch[ALLOCATED_ANNOTATION] = None if after.ledger is None else encode_ledger(after.ledger)
    if after.drift != before.drift:
        patch[DRIFT_ANNOTATION] = None if after.drift is None else encode_findings(after.drift)
    if after.mismatch != before.mismatch:
        patch[MISMATCH_ANNOTATION] = (
            None if after.mismatch is None else encode_findings(after.mismatch)
        )
    return patch
