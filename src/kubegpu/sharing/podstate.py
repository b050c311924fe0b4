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
from kubegpu.sharing.annotations import AllocationDecision
from kubegpu.sharing.claim import (
    TERMINAL_PHASES,
    PodClaim,
    read_claim,
    read_decision,
    share_without_decision,
)
from kubegpu.sharing.resources import ResourceNames

__all__ = ["TERMINAL_PHASES", "PodReading", "pod_uid", "read_decision", "read_pod", "usage_of"]


@dataclass(frozen=True)
class PodReading:
    """The outcome of reading one pod: its usage (``None``: holds nothing we track) and any
    problem worth a log line (malformed annotation, decision for another node, ...)."""

    usage: PodUsage | None
    decision: AllocationDecision | None = None
    problem: str = ""


def pod_uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) else ""


def read_pod(pod: Mapping[str, Any], names: ResourceNames) -> PodReading:
    return usage_of(read_claim(pod, names), names)


def usage_of(claim: PodClaim, names: ResourceNames) -> PodReading:
    """What ``claim`` charges, by the rules in this module's docstring."""
    if not claim.uid:
        return PodReading(None, problem=f"pod {claim.key}: no metadata.uid; ignored")
    if claim.terminal:
        return PodReading(None)
    totals, decision, problem = claim.totals, claim.decision, claim.problem
    if totals is None:
        # Unreadable resources cannot be charged; the scheduler would not have bound it either.
        return PodReading(None, problem=f"{claim.refusal}; not charged")
    node = claim.node
    if not node:
        if decision is None:
            return PodReading(None, problem=problem)
        usage = PodUsage(
            claim.uid,
            claim.key,
            decision.node,
            totals.cpu_milli,
            totals.host_memory_mib,
            decision.cards,
            bound=False,
        )
        return PodReading(usage, decision, problem)
    if decision is not None:
        usage = PodUsage(
            claim.uid, claim.key, node, totals.cpu_milli, totals.host_memory_mib, decision.cards
        )
        return PodReading(usage, decision, problem)
    if totals.whole_gpus and not problem:
        problem = (
            f"pod {claim.key}: bound to {node} with {totals.whole_gpus} {names.whole_gpu} but no "
            "allocation annotation (placed by another scheduler?); assuming its highest-index "
            "free cards"
        )
    elif (totals.compute_milli or totals.gpu_memory_mib) and not problem:
        problem = share_without_decision(claim.key, node)
    usage = PodUsage(
        claim.uid,
        claim.key,
        node,
        totals.cpu_milli,
        totals.host_memory_mib,
        undecided_whole_gpus=totals.whole_gpus,
    )
    return PodReading(usage, None, problem)
