"""Decisions in flight: where kube-scheduler is about to bind the pods the extender just scored.

kube-scheduler binds asynchronously: once it has chosen a node for pod N it starts N's binding
cycle (our ``/bind``, where the cards are decided and reserved) and goes on to filter and score
pod N+1 at once. Without help the extender answers N+1 from a view that lacks N, so both may be
sent to the last room of one node and one bind is refused (issue 27 measured 49 of 800 pods on
20 nearly full nodes with 20 scheduling loops).

So filter and prioritize go through :class:`InFlight`, which holds a *tentative reservation*
for each pod it expects to be bound: when prioritize ranks a pod, on its top-scored node (the
shipped scheduler configs give the extender weight 5, enough to outweigh any in-tree score),
and when filter lets exactly one node through (kube-scheduler then binds there without asking
for scores). It holds the cards the engine would pick, in the cluster view, where it counts
like a bind in flight, so the next pod's filter and prioritize see it. The view counts a pod
once: a reservation of its bind, or what the API server says it holds, wins over a tentative
one, and the pod watch drops the tentative one when the pod is deleted, bound or decided.

A tentative reservation ends exactly once, counted in
``kubegpu_extender_tentative_reservations_total{event}`` (``made`` when it starts):

* ``confirmed``: the pod's bind came for that node; the bind drops it and decides as before,
  in the same event-loop step, so the room it held is the pod's own.
* ``moved``: the bind came for another node (kube-scheduler's own scores or its random
  tie-break chose differently); dropped, and the bind decides there.
* ``replaced``: the pod was filtered or scored again before any bind (kube-scheduler retried
  it); its own earlier one never counts against it, and never stacks.
* ``expired``: no bind within :data:`TENTATIVE_TTL_S`; ``gone``: the watch had dropped it.

A pod whose tentative reservations keep ending without a bind (``MAX_MISSES`` in a row: a later
plugin rejects it every cycle) gets none until a bind of it arrives, so a pod that can never be
bound cannot keep room from others by being retried. Nothing here is a node-wide loop: each call
touches the one pod and, for a new tentative reservation, one node's engine row.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kubegpu.extender.holdings import usage_of
from kubegpu.extender.metrics import ExtenderMetrics
from kubegpu.extender.scheduler import FilterOutcome, GpuScheduler, Unschedulable
from kubegpu.sharing.podstate import pod_uid
from kubegpu.sharing.resources import GpuRequest, RequestKind

# How long a tentative reservation waits for its bind. The bind normally arrives milliseconds
# after prioritize (the rest of kube-scheduler's cycle, then its binding goroutine), but on a
# busy extender the request may queue for up to the extender's httpTimeout (10 s in every
# shipped scheduler config, deploy/scheduler/*.yaml) before kube-scheduler gives up on it and
# retries the pod, whose next filter replaces the tentative one anyway: hence httpTimeout plus
# 5 s for kube-scheduler's PreBind plugins. Longer would keep the room of a pod the scheduler
# dropped after scoring (a later plugin failed, the pod was preempted) from other pods: they
# are refused on that node with a capacity reason and, refused by an extender, retried after
# kube-scheduler's pod backoff (1 s doubling to 10 s), so the room is offered again within
# TTL plus one backoff. A bind that comes later still decides on the view as it is then.
TENTATIVE_TTL_S = 15.0
# Tentative reservations in a row that end without a bind before a pod gets no more of them.
MAX_MISSES = 3
# Pods whose misses are remembered (oldest forgotten first): bounded memory under any churn.
MISSES_KEPT = 4096

SAME_NODE, OTHER_NODE, NONE = "same-node", "other-node", "none"


class InFlight:
    """Filter and prioritize that see the binds kube-scheduler is about to send."""

    def __init__(
        self,
        scheduler: GpuScheduler,
        metrics: ExtenderMetrics,
        *,
        ttl_s: float = TENTATIVE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.view = scheduler.view
        self.ttl_s = ttl_s
        self.clock = clock
        self._events = metrics.tentative
        # uid -> (deadline, node), in the order made: with one TTL that is deadline order.
        self._held: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self._misses: collections.OrderedDict[str, int] = collections.OrderedDict()
        metrics.tentative_held.set_function(lambda: len(self.view.tentative))

    # ------------------------------------------------------------------ the verbs
    def filter(
        self, pod: Mapping[str, Any], request: GpuRequest, node_names: Sequence[str]
    ) -> FilterOutcome:
        """A new scheduling cycle of ``pod``: its own earlier tentative reservation goes (a
        retry), then the filter; one node passing is where kube-scheduler will bind it."""
        self.expire()
        uid = pod_uid(pod)
        self._end(uid, "replaced", miss=True)
        outcome = self.scheduler.filter(request, node_names)
        if len(outcome.passed) == 1:
            self._expect(pod, uid, request, outcome.passed[0])
        return outcome

    def prioritize(
        self, pod: Mapping[str, Any], request: GpuRequest, node_names: Sequence[str]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """:meth:`GpuScheduler.prioritize_rows`, scored without the pod's own tentative
        reservation; then the pod is expected on the first node with the top score."""
        self.expire()
        uid = pod_uid(pod)
        self._end(uid, "replaced", miss=False)
        positions, rows, scores = self.scheduler.prioritize_rows(request, node_names)
        if scores.size:
            best = int(rows[int(np.argmax(scores))])
            self._expect(pod, uid, request, self.scheduler.row_names[best])
        return positions, rows, scores

    def settle(self, uid: str, node: str) -> str:
        """A bind of the pod to ``node`` arrived: its tentative reservation ends (the bind
        decides afresh). Returns where it was: ``same-node``, ``other-node`` or ``none``."""
        self.expire()
        self._misses.pop(uid, None)
        held = self._held.get(uid)
        if held is None:
            return NONE
        same = held[1] == node
        if not self._end(uid, "confirmed" if same else "moved", miss=False):
            return NONE
        return SAME_NODE if same else OTHER_NODE

    def expire(self) -> None:
        """End every tentative reservation whose bind is overdue."""
        now = self.clock()
        while self._held:
            uid, (deadline, _) = next(iter(self._held.items()))
            if deadline > now:
                break
            self._end(uid, "expired", miss=True)

    # ------------------------------------------------------------------ bookkeeping
    def _expect(self, pod: Mapping[str, Any], uid: str, request: GpuRequest, node: str) -> None:
        if not uid or request.kind is RequestKind.NONE:
            return
        if self._misses.get(uid, 0) >= MAX_MISSES:
            return
        if self.view.usage(uid) is not None:
            return  # a bind of it in flight, or decided already: it holds its room
        try:
            decision = self.scheduler.choose(request, node)
        except Unschedulable:
            return  # the score's compute-only view let it through; filter would not have
        self.view.hold_tentative(usage_of(pod, request, decision, bound=False))
        self.scheduler.engine()  # the next call sees it
        self._held[uid] = (self.clock() + self.ttl_s, node)
        self._events.labels("made").inc()

    def _end(self, uid: str, event: str, *, miss: bool) -> bool:
        """End the pod's tentative reservation, if it has one, counted as ``event`` (``gone``
        when the watch dropped it first); True when it still counted in the view."""
        if self._held.pop(uid, None) is None:
            return False
        counted = self.view.drop_tentative(uid) is not None
        self._events.labels(event if counted else "gone").inc()
        if miss:
            self._misses[uid] = self._misses.pop(uid, 0) + 1
            while len(self._misses) > MISSES_KEPT:
                self._misses.popitem(last=False)
        return counted
