"""What one pod holds, read from its JSON: the rules the cluster view applies to every pod.

A non-terminated pod bound to a node holds its CPU/memory requests there. Its cards come from
its allocation annotation when that names the same node; a pod that is decided but not yet
bound holds its decision too (conservative: a card is never offered twice while a bind is in
flight, even across an extender restart). A malformed annotation is reported and treated as
no decision, never as an exception. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubegpu.sharing.accounting import PodUsage
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    AnnotationError,
    decode_allocation,
)
from kubegpu.sharing.resources import RequestError, ResourceNames, pod_key, pod_totals

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodReading:
    """The outcome of reading one pod: its usage (``None``: holds nothing we track) and any
    problem worth a log line (malformed annotation, decision for another node, ...)."""

    usage: PodUsage | None
    decision: AllocationDecision | None = None
    problem: str = ""


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_uid(pod: Mapping[str, Any]) -> str:
    uid = _meta(pod).get("uid")
    return uid if isinstance(uid, str) else ""


def read_decision(pod: Mapping[str, Any]) -> tuple[AllocationDecision | None, str]:
    """The pod's allocation decision, or ``None`` and why not (empty when simply absent)."""
    annotations = _meta(pod).get("annotations")
    if not isinstance(annotations, Mapping) or ALLOCATION_ANNOTATION not in annotations:
        return None, ""
    try:
        return decode_allocation(annotations[ALLOCATION_ANNOTATION]), ""
    except AnnotationError as exc:
        return None, f"pod {pod_key(pod)}: {exc}; treated as having no decision"


def read_pod(pod: Mapping[str, Any], names: ResourceNames) -> PodReading:
    uid = pod_uid(pod)
    key = pod_key(pod)
    if not uid:
        return PodReading(None, problem=f"pod {key}: no metadata.uid; ignored")
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if phase in TERMINAL_PHASES:
        return PodReading(None)
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    decision, problem = read_decision(pod)
    try:
        totals = pod_totals(pod, names)
    except RequestError as exc:
        # Unreadable resources cannot be charged; the scheduler would not have bound it either.
        return PodReading(None, problem=f"{exc}; not charged")
    if not node:
        if decision is None:
            return PodReading(None, problem=problem)
        usage = PodUsage(
            uid,
            key,
            decision.node,
            totals.cpu_milli,
            totals.memory_mib,
            decision.cards,
            bound=False,
        )
        return PodReading(usage, decision, problem)
    if decision is not None and decision.node != node:
        problem = (
            f"pod {key}: allocation names node {decision.node} but the pod is bound to {node}; "
            "its cards are unknown"
        )
        decision = None
    if decision is not None:
        usage = PodUsage(uid, key, node, totals.cpu_milli, totals.memory_mib, decision.cards)
        return PodReading(usage, decision, problem)
    if totals.whole_gpus and not problem:
        problem = (
            f"pod {key}: bound to {node} with {totals.whole_gpus} {names.whole_gpu} but no "
            "allocation annotation (placed by another scheduler?); assuming its highest-index "
            "free cards"
        )
    elif (totals.compute_milli or totals.gpu_memory_mib) and not problem:
        problem = (
            f"pod {key}: bound to {node} with a GPU share but no allocation annotation; the node "
            "agent will refuse it and it holds no card"
        )
    usage = PodUsage(
        uid,
        key,
        node,
        totals.cpu_milli,
        totals.memory_mib,
        undecided_whole_gpus=totals.whole_gpus,
    )
    return PodReading(usage, None, problem)
