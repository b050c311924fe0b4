"""Which pods may be evicted for a waiting one, as the extender's cluster view knows them:
priorities, start times, disruption budgets, what an eviction frees of what kube-scheduler
counts, and whether a pod already preempted. Read-only; :mod:`kubegpu.extender.preemption`
decides and acts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.sharing.accounting import PodUsage
from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.preemption import (
    Candidate,
    NodeVictims,
    budget_violations,
    importance,
    victims_on_node,
)
from kubegpu.sharing.resources import GpuRequest, RequestKind


def pod_priority(pod: Mapping[str, Any]) -> int:
    value = (pod.get("spec") or {}).get("priority")
    return int(value) if isinstance(value, int) else 0


def _started(pod: Mapping[str, Any]) -> float:
    raw = (pod.get("status") or {}).get("startTime") or (pod.get("metadata") or {}).get(
        "creationTimestamp"
    )
    if not isinstance(raw, str) or not raw:
        return 0.0
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class VictimView:
    """The cluster view, read for preemption."""

    def __init__(self, scheduler: GpuScheduler) -> None:
        self.scheduler = scheduler
        self.view = scheduler.view

    def request(self, pod: Mapping[str, Any]) -> GpuRequest | None:
        """The pod's GPU request, ``None`` when it asks for no GPU of ours (or cannot)."""
        claim = read_claim(pod, self.view.names)
        request = claim.request
        if request is None or request.kind is RequestKind.NONE:
            return None
        return request

    def on_node(
        self,
        node: str,
        pod: Mapping[str, Any],
        request: GpuRequest,
        budgets: Sequence[Mapping[str, Any]] | None,
    ) -> NodeVictims | None:
        """The cheapest eviction on ``node`` that frees a card for ``pod`` (the pod's own hold
        and reservation left out), its budget violations counted exactly; ``None`` when the
        node can never take it or no lower-priority pods there free enough."""
        info = self.view.nodes.get(node)
        if info is None or self.scheduler.structural_reason(info, node, request):
            return None
        uid = pod_uid(pod)
        usages = [u for u in self.view.usages_on(node) if u.uid != uid]
        candidates = self.candidates(node, pod_priority(pod), budgets)
        placement: PodRequest = request.to_placement()
        found = victims_on_node(info, usages, candidates, placement)
        if found is None or not found.victims or budgets is None:
            return found
        exact = self.violations(found.uids, budgets)
        return NodeVictims(found.node, found.victims, exact, found.cards)

    def candidates(
        self, node: str, below: int | None, budgets: Sequence[Mapping[str, Any]] | None
    ) -> list[Candidate]:
        """Bound pods on ``node`` of priority below ``below`` (any, when None), flagged when
        evicting one alone would exceed a budget."""
        out: list[Candidate] = []
        for usage in self.view.usages_on(node):
            if not usage.bound or usage.uid in self.view.nominated:
                continue
            pod = self.pod(usage.uid, usage)
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue  # terminating already: its room is on its way
            priority = pod_priority(pod)
            if below is not None and priority >= below:
                continue
            flagged = bool(budgets) and bool(budget_violations([pod], budgets or []))
            out.append(Candidate(usage, priority, _started(pod), flagged))
        return out

    def pod(self, uid: str, usage: PodUsage | None = None) -> Mapping[str, Any] | None:
        usage = usage or self.view.usage(uid)
        if usage is None:
            return None
        namespace, _, name = usage.key.partition("/")
        pod = self.view.pod_json.get((namespace, name))
        return pod if pod is not None and pod_uid(pod) == uid else None

    def key(self, uid: str) -> str:
        usage = self.view.usage(uid)
        return usage.key if usage is not None else uid

    def violations(self, uids: Sequence[str], budgets: Sequence[Mapping[str, Any]]) -> int:
        pods = [p for p in (self.pod(u) for u in uids) if p is not None]
        return len(budget_violations(pods, budgets))

    def with_counted_resources(
        self, node: str, found: NodeVictims, proposed: Sequence[str]
    ) -> tuple[str, ...]:
        """``found``'s victims, plus proposed ones (least important first) until they free at
        least what the proposed set frees of every resource kube-scheduler counts."""
        chosen = list(found.uids)
        need = self.frees(node, proposed)
        extra = [u for u in reversed(proposed) if u not in chosen]
        while not _covers(self.frees(node, chosen), need) and extra:
            chosen.append(extra.pop(0))
        by_uid = {c.uid: c for c in self.candidates(node, None, None)}
        known = [by_uid[u] for u in chosen if u in by_uid]
        ordered = [c.uid for c in sorted(known, key=importance, reverse=True)]
        return tuple(ordered + [u for u in chosen if u not in by_uid])

    def frees(self, node: str, uids: Sequence[str]) -> tuple[int, int, int, int]:
        """What evicting ``uids`` frees of what kube-scheduler counts on ``node``: CPU milli,
        memory MiB, whole GPUs, share slots. A card that holds shares is withdrawn from the
        node's ``nvidia.com/gpu`` by the node agent (docs/sharing.md, section 3), so evicting the
        last shares of a card frees one whole GPU too."""
        gone = set(uids)
        sharing: dict[int, set[str]] = {}
        for usage in self.view.usages_on(node):
            for card in usage.cards:
                if card.compute_milli < MILLI_PER_GPU:
                    sharing.setdefault(card.index, set()).add(usage.uid)
        cpu = memory = slots = 0
        whole = sum(1 for holders in sharing.values() if holders <= gone)
        for uid in uids:
            pod = self.pod(uid)
            request = read_claim(pod, self.view.names).request if pod is not None else None
            if request is None:
                continue
            cpu += request.cpu_milli
            memory += request.host_memory_mib
            whole += request.whole_gpus
            slots += sum(c.share_slots for c in request.containers if not c.init or c.sidecar)
        return cpu, memory, whole, slots

    def nominated_to(self, pod: Mapping[str, Any]) -> str:
        """The pod's nominatedNodeName, as sent or as the watch last saw it."""
        node = (pod.get("status") or {}).get("nominatedNodeName")
        if not node:
            meta = pod.get("metadata") or {}
            key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
            seen = self.view.pod_json.get(key)
            if seen is not None and pod_uid(seen) == pod_uid(pod):
                node = (seen.get("status") or {}).get("nominatedNodeName")
        return str(node or "")

    def victims_terminating(self, pod: Mapping[str, Any]) -> bool:
        """kube-scheduler's rule (``PodEligibleToPreemptOthers``): a pod nominated to a node
        where lower-priority pods are still terminating has preempted already (through the
        verb or here) and waits for them; preempting again would evict twice."""
        node = (pod.get("status") or {}).get("nominatedNodeName")
        if not node:
            return False
        priority = pod_priority(pod)
        for usage in self.view.usages_on(str(node)):
            other = self.pod(usage.uid, usage)
            if (
                other is not None
                and (other.get("metadata") or {}).get("deletionTimestamp")
                and pod_priority(other) < priority
            ):
                return True
        return False


def _covers(have: tuple[int, ...], need: tuple[int, ...]) -> bool:
    return all(h >= n for h, n in zip(have, need, strict=True))
