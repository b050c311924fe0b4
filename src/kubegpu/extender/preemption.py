"""Preemption that sees cards: kube-scheduler's preempt verb, and the extender's own preemption
for the pods kube-scheduler's cannot help.

Two paths, one rule (:mod:`kubegpu.sharing.preemption`: the smallest set of lower-priority pods
whose eviction frees one card enough for the waiting pod):

* **The verb** (``preemptVerb: preempt``). kube-scheduler calls it when its own dry run found
  victims on some nodes, which it does only when a resource it counts is short (``nvidia.com/gpu``,
  share slots, CPU, memory). Per node, the answer keeps the proposed victims when they free a
  card, or names others that do (they must still free what the proposed ones free of those
  counted resources, so kube-scheduler's own filters pass too), or leaves the node out when no
  set of lower-priority pods there frees a card.
* **The extender's own preemption.** A share blocked only by card memory or compute is a pod
  kube-scheduler's filters pass everywhere (it ignores ``kubegpu.io/gpu-memory`` and
  ``gpu-compute``), so its dry run finds no victims ("expected at least one victim pod on
  node") and never calls the verb. When the extender's filter turned a pod down on every node
  and no preempt call for it followed within :data:`VERB_GRACE_S`, the extender takes
  kube-scheduler's steps itself, once, while leader: chooses the node in kube-scheduler's order,
  marks each victim ``DisruptionTarget`` (reason ``PreemptionByScheduler``) and deletes it, sets
  the pod's ``nominatedNodeName``, and holds the freed cards for it in the cluster view until
  it is bound or :data:`HOLD_TTL_S` passes. kube-scheduler then tries that node first, does not
  preempt again while the victims terminate, and counts the pod there for lower priorities.

Victims are bound pods of strictly lower priority (``spec.priority``, set by admission from the
PriorityClass); a pod with ``preemptionPolicy: Never`` preempts nothing. PodDisruptionBudgets
are read at each decision and weigh as kube-scheduler weighs them (fewest violations first;
never a hard stop, as in kube-scheduler, whose preemption deletes rather than evicts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.extender.holdings import held_cards
from kubegpu.extender.leader import LeaderGate
from kubegpu.extender.metrics import ExtenderMetrics
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.extender.victims import VictimView, pod_priority
from kubegpu.extender.wire import PreemptionArgs
from kubegpu.sharing.accounting import PodUsage
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.podstore import Evictions, PodStoreError
from kubegpu.sharing.preemption import (
    NodeVictims,
    pick_node,
)
from kubegpu.sharing.resources import GpuRequest, RequestKind, pod_key

log = logging.getLogger(__name__)

# How long after a filter that turned a pod down everywhere the extender waits for
# kube-scheduler's preempt call before preempting itself: the call comes in the same
# scheduling cycle (PostFilter runs right after the extenders' filter), milliseconds later.
VERB_GRACE_S = 1.0
# How long freed cards stay held for the pod they were freed for: the victims' grace period
# (30 s by default) and a few scheduling attempts of the pod (backoff up to 10 s).
HOLD_TTL_S = 90.0
# How long a pod for which no node had victims is left alone (a few of kube-scheduler's
# retries, whose backoff reaches 10 s): a pending pod no eviction can help would otherwise
# cost a look at every node on each retry. Lower-priority pods bound meanwhile wait for the
# next look.
QUIET_S = 30.0
# Nodes with a possible eviction examined per decision, as kube-scheduler's
# minCandidateNodesAbsolute (100) bounds its own dry run.
MAX_CANDIDATE_NODES = 100


class Preemption:
    """The preempt verb's answers and the extender's own preemption, over one scheduler."""

    def __init__(
        self,
        scheduler: GpuScheduler,
        evictions: Evictions | None,
        metrics: ExtenderMetrics,
        *,
        leader: LeaderGate | None = None,
        enabled: bool = True,
        verb_grace_s: float = VERB_GRACE_S,
        hold_ttl_s: float = HOLD_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        component: str = "kubegpu-extender",
    ) -> None:
        self.scheduler = scheduler
        self.view = scheduler.view
        self.victims = VictimView(scheduler)
        self.evictions = evictions
        self.metrics = metrics
        self.leader = leader
        self.enabled = enabled
        self.verb_grace_s = verb_grace_s
        self.hold_ttl_s = hold_ttl_s
        self.clock = clock
        self.component = component
        self._verb_seen: dict[str, float] = {}  # uid -> when a preempt call for it came
        self._held_until: dict[str, float] = {}  # uid -> when its nomination hold lapses
        self._waiting: set[str] = set()  # uids with a decision scheduled
        self._quiet_until: dict[str, float] = {}  # uid -> no new decision before then
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ the verb
    async def answer(self, args: PreemptionArgs) -> dict[str, tuple[tuple[str, ...], int]]:
        """Per node: the victims that free a card for the pod (most important first) and their
        budget violations; nodes where none can are left out."""
        pod = args.pod
        uid = pod_uid(pod)
        self._verb_seen[uid] = self.clock()
        request = self.victims.request(pod)
        if request is None:
            self.metrics.preemptions.labels("verb", "kept").inc(len(args.victims))
            return dict(args.victims)  # no GPU of ours: kube-scheduler's own answer stands
        budgets = await self._budgets()
        out: dict[str, tuple[tuple[str, ...], int]] = {}
        freeing: list[NodeVictims] = []  # answered nodes where a card is freed, for the hold
        for node, (proposed, proposed_violations) in args.victims.items():
            found = self.victims.on_node(node, pod, request, budgets)
            if found is None or (not found.victims and not proposed):
                self.metrics.preemptions.labels("verb", "refused").inc()
                log.info("preempt for pod %s: no card on %s can be freed", pod_key(pod), node)
                continue
            if not found.victims and self.victims.nominated_to(pod) == node:
                # It preempted here already and its card is free: what kube-scheduler still
                # counts short is the node agent's withdrawn whole-GPU ids (or its node status)
                # catching up with the victims' departure. Evicting more would be for nothing.
                self.metrics.preemptions.labels("verb", "refused").inc()
                log.info(
                    "preempt for pod %s: its card on %s is free already; not evicting %s",
                    pod_key(pod),
                    node,
                    ", ".join(self.victims.key(u) for u in proposed),
                )
                continue
            chosen = self.victims.with_counted_resources(node, found, proposed)
            if set(chosen) == set(proposed):
                result = "kept"
                violations = (
                    proposed_violations
                    if budgets is None
                    else self.victims.violations(chosen, budgets)
                )
                chosen = tuple(proposed)
            else:
                result = "narrowed"
                violations = self.victims.violations(chosen, budgets or [])
            self.metrics.preemptions.labels("verb", result).inc()
            log.info(
                "preempt for pod %s on %s: %s (kube-scheduler proposed %s)",
                pod_key(pod),
                node,
                ", ".join(self.victims.key(u) for u in chosen),
                ", ".join(self.victims.key(u) for u in proposed) or "none",
            )
            out[node] = (chosen, violations)
            if found.victims:
                freeing.append(found)
        self._hold_expected(pod, request, freeing)
        return out

    def _hold_expected(
        self, pod: Mapping[str, Any], request: GpuRequest, freeing: Sequence[NodeVictims]
    ) -> None:
        """Hold the card on the node kube-scheduler will pick among those answered (its order
        is :func:`pick_node`'s) while its victims terminate: kube-scheduler's nominator holds
        only what it counts, not the card, so a lower-priority share could take the freed
        memory or compute before the pod comes back. A wrong guess (kube-scheduler's last
        tie-break, start times, chose another) holds a card for nothing until the pod is bound
        or :data:`HOLD_TTL_S` passes; it never lets a card be over-committed."""
        choice = pick_node(freeing)
        uid = pod_uid(pod)
        if choice is None or not choice.cards or not uid:
            return
        self._expire()
        self.view.hold_nominated(self._hold(pod, request, choice))
        self._held_until[uid] = self.clock() + self.hold_ttl_s
        self.scheduler.engine()

    # ------------------------------------------------------------------ the extender's own
    def note_unschedulable(self, pod: Mapping[str, Any], request: GpuRequest) -> None:
        """The filter turned ``pod`` down on every node: decide, after :data:`VERB_GRACE_S`,
        whether the extender must preempt for it."""
        if not self.enabled or self.evictions is None or request.kind is RequestKind.NONE:
            return
        uid = pod_uid(pod)
        spec = pod.get("spec") or {}
        if not uid or spec.get("nodeName") or spec.get("preemptionPolicy") == "Never":
            return
        self._expire()
        if uid in self._waiting or uid in self._held_until:
            return
        if self._quiet_until.get(uid, 0.0) > self.clock():
            return
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        self._waiting.add(uid)
        task = asyncio.get_running_loop().create_task(
            self._after_grace(namespace, name, uid, self.clock()),
            name=f"kubegpu-preempt-{namespace}/{name}",
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _after_grace(self, namespace: str, name: str, uid: str, filtered_at: float) -> None:
        try:
            await asyncio.sleep(self.verb_grace_s)
            if self._verb_seen.get(uid, -1.0) >= filtered_at:
                return  # kube-scheduler's preemption handled it, through the verb
            await self.preempt_for(namespace, name, uid)
        except Exception:
            self.metrics.preemptions.labels("extender", "error").inc()
            log.exception("preemption for pod %s/%s failed", namespace, name)
        finally:
            self._waiting.discard(uid)

    async def preempt_for(self, namespace: str, name: str, uid: str) -> NodeVictims | None:
        """Preempt for the pending pod now, if lower-priority pods on some node free a card for
        it; returns what was done (``None``: nothing)."""
        assert self.evictions is not None
        if self.leader is not None and await self.leader.refusal():
            return None  # the leader's extender preempts, as only it binds
        pod = self.view.pod_json.get((namespace, name))
        if pod is None or pod_uid(pod) != uid or (pod.get("spec") or {}).get("nodeName"):
            return None
        request = self.victims.request(pod)
        if request is None or self.victims.victims_terminating(pod):
            return None
        priority = pod_priority(pod)
        if not any(
            pod_priority(other) < priority and (other.get("spec") or {}).get("nodeName")
            for other in self.view.pod_json.values()
        ):
            return None  # nothing of lower priority runs anywhere: no node to look at
        budgets = await self._budgets()
        options: list[NodeVictims] = []
        for node in list(self.view.nodes):
            found = self.victims.on_node(node, pod, request, budgets)
            if found is None:
                continue
            if not found.victims:
                return None  # it fits somewhere now: nothing to preempt
            options.append(found)
            if len(options) >= MAX_CANDIDATE_NODES:
                break
            await asyncio.sleep(0)  # thousands of nodes: let the verbs in between
        choice = pick_node(options)
        if choice is None:
            # Not looked at again for a while: kube-scheduler retries such a pod every 10 s.
            self._quiet_until[uid] = self.clock() + QUIET_S
            self.metrics.preemptions.labels("extender", "no-victims").inc()
            log.info("pod %s: no lower-priority pods free a card for it", pod_key(pod))
            return None
        await self._evict(pod, request, choice)
        return choice

    async def _evict(
        self, pod: Mapping[str, Any], request: GpuRequest, choice: NodeVictims
    ) -> None:
        assert self.evictions is not None
        key = pod_key(pod)
        uid = pod_uid(pod)
        cards = ",".join(str(c) for c in choice.cards)
        message = (
            f"{self.component}: preempting to accommodate a higher priority pod "
            f"({key}, GPU {cards} of node {choice.node})"
        )
        # Hold the cards first: other pods must not be placed there while the victims go.
        self.view.hold_nominated(self._hold(pod, request, choice))
        self._held_until[uid] = self.clock() + self.hold_ttl_s
        self.scheduler.engine()
        for victim in choice.victims:
            namespace, _, name = victim.usage.key.partition("/")
            try:
                await self.evictions.mark_preempted(namespace, name, message)
            except PodStoreError as exc:
                log.warning(
                    "victim %s: cannot set its DisruptionTarget condition: %s",
                    victim.usage.key,
                    exc,
                )
            await self.evictions.delete(namespace, name)
            self.metrics.preemption_victims.inc()
            log.info(
                "preempted pod %s (priority %d) on node %s GPU %s for pod %s (priority %d)",
                victim.usage.key,
                victim.priority,
                choice.node,
                cards,
                key,
                pod_priority(pod),
            )
        namespace, _, name = key.partition("/")
        await self.evictions.nominate(namespace, name, choice.node)
        self.metrics.preemptions.labels("extender", "preempted").inc()

    def _hold(self, pod: Mapping[str, Any], request: GpuRequest, choice: NodeVictims) -> PodUsage:
        info = self.view.nodes[choice.node]
        assert info.inventory is not None
        cards = held_cards(info.inventory, request, choice.cards)
        return PodUsage(
            pod_uid(pod),
            pod_key(pod),
            choice.node,
            request.cpu_milli,
            request.host_memory_mib,
            cards,
            bound=False,
        )

    # ------------------------------------------------------------------ holds
    def without_own_hold(self, uid: str) -> PodUsage | None:
        """Lift the pod's own hold while it is filtered, scored or bound (the freed cards are
        its own); :meth:`restore_hold` puts it back if the pod is still waiting."""
        return self.view.drop_nominated(uid) if uid in self.view.nominated else None

    def restore_hold(self, usage: PodUsage | None) -> None:
        if usage is None or usage.uid not in self._held_until:
            return
        if self.view.usage(usage.uid) is None:
            self.view.hold_nominated(usage)

    def release(self, uid: str) -> None:
        """The pod is being bound: its hold's work is done."""
        self._held_until.pop(uid, None)
        self.view.drop_nominated(uid)

    def _expire(self) -> None:
        now = self.clock()
        for uid, until in list(self._held_until.items()):
            if until <= now or uid not in self.view.nominated:
                del self._held_until[uid]
                self.view.drop_nominated(uid)
        for uid, seen in list(self._verb_seen.items()):
            if now - seen > self.hold_ttl_s:
                del self._verb_seen[uid]
        for uid, until in list(self._quiet_until.items()):
            if until <= now:
                del self._quiet_until[uid]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _budgets(self) -> list[dict[str, Any]] | None:
        if self.evictions is None:
            return None
        try:
            return await self.evictions.disruption_budgets()
        except PodStoreError as exc:
            log.warning("cannot read PodDisruptionBudgets, preempting without them: %s", exc)
            return None
