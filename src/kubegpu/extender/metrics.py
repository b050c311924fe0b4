"""The extender's own bookkeeping beside its HTTP face: the Prometheus metrics it keeps
(:class:`ExtenderMetrics`, documented in docs/metrics.md) and the per-pod locks that keep two
binds of one pod apart (:class:`PodLocks`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PodLocks:
    """One lock per pod UID, so binds of one pod run one after another (kube-scheduler retries
    a bind after its ``httpTimeout`` while the first handler may still run): the view keeps one
    reservation per UID, and two binds of a pod at once would overwrite each other's.

    A lock is forgotten only when no bind holds it *or waits for it*. ``Lock.locked()`` is
    not that test: between a release and the woken waiter running it reads False, and dropping
    the lock then hands the next bind a fresh one that runs beside the waiter."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, uid: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(uid) or (asyncio.Lock(), 0)
        self._locks[uid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[uid]
            if users == 1:
                del self._locks[uid]
            else:
                self._locks[uid] = (lock, users - 1)


# The label values of kubegpu_extender_stale_binds_total and of
# kubegpu_extender_tentative_reservations_total (kubegpu.extender.inflight sets them).
STALE_BIND_PLACES = ("same-node", "other-node", "none")
TENTATIVE_EVENTS = ("made", "confirmed", "moved", "replaced", "expired", "gone")
# kubegpu_extender_preemptions_total{path, result} (kubegpu.extender.preemption sets them):
# "verb" answers kube-scheduler's preempt call, "extender" is the extender's own preemption.
PREEMPTION_RESULTS = {
    "verb": ("narrowed", "kept", "refused", "error"),
    "extender": ("preempted", "no-victims", "error"),
}


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.latency = Histogram(
            "kubegpu_extender_request_duration_seconds",
            "Time to answer one extender call, by verb.",
            ["verb"],
            registry=registry,
            buckets=_BUCKETS,
        )
        self.decisions = Counter(
            "kubegpu_extender_decisions_total",
            "Filter and bind outcomes for GPU pods.",
            ["verb", "outcome"],
            registry=registry,
        )
        self.rejections = Counter(
            "kubegpu_extender_node_rejections_total",
            "Nodes rejected for a GPU pod, by reason.",
            ["reason"],
            registry=registry,
        )
        self.binds = Counter(
            "kubegpu_extender_binds_total",
            "Bind requests by result.",
            ["result"],
            registry=registry,
        )
        self.stale_binds = Counter(
            "kubegpu_extender_stale_binds_total",
            "Binds refused for want of room on the node kube-scheduler chose, which the "
            "extender's filter had passed: its answer had gone stale. By where the pod's "
            "tentative reservation was: same-node, other-node, none.",
            ["tentative"],
            registry=registry,
        )
        self.tentative = Counter(
            "kubegpu_extender_tentative_reservations_total",
            "Tentative reservations (where a scored pod is expected to be bound) by event: "
            "made, then one of confirmed, moved, replaced, expired, gone.",
            ["event"],
            registry=registry,
        )
        # Every labelled series from the start, at 0: a stale bind is rare, and a series that
        # appears only with the first one cannot be rated or alerted on before it.
        for where in STALE_BIND_PLACES:
            self.stale_binds.labels(where)
        for event in TENTATIVE_EVENTS:
            self.tentative.labels(event)
        self.preemptions = Counter(
            "kubegpu_extender_preemptions_total",
            "Card-level preemption decisions, by path (verb: kube-scheduler's preempt call, per "
            "node: narrowed to other victims, kept as proposed, refused; extender: its own "
            "preemption for a pod kube-scheduler's cannot help) and result.",
            ["path", "result"],
            registry=registry,
        )
        for path, results in PREEMPTION_RESULTS.items():
            for result in results:
                self.preemptions.labels(path, result)
        self.preemption_victims = Counter(
            "kubegpu_extender_preemption_victims_total",
            "Pods the extender's own preemption evicted.",
            registry=registry,
        )
        self.tentative_held = Gauge(
            "kubegpu_extender_tentative_reservations_held",
            "Tentative reservations the cluster view holds now.",
            registry=registry,
        )
        self.conflicts = Counter(
            "kubegpu_extender_bind_conflicts_total",
            "409 Conflicts met while recording a decision (each one retried).",
            registry=registry,
        )
        self.bad_requests = Counter(
            "kubegpu_extender_bad_requests_total",
            "Requests refused as malformed, by verb.",
            ["verb"],
            registry=registry,
        )
        self.refused = Counter(
            "kubegpu_extender_requests_refused_total",
            "Requests refused before their handler ran: too-large (413), busy (503: the "
            "in-flight body budget is spent), timeout (408: the body did not arrive in time), "
            "bad-request (400), connections (closed on arrival over the connection cap).",
            ["reason"],
            registry=registry,
        )
        self.body_bytes_in_flight = Gauge(
            "kubegpu_extender_request_body_bytes_in_flight",
            "Bytes of request bodies read or reserved and not yet released.",
            registry=registry,
        )
        # The collector never scans frozen objects (kubegpu.extender.collector): a steady
        # climb here is garbage it cannot reach.
        Gauge(
            "kubegpu_extender_heap_frozen_objects",
            "Objects in the process's frozen heap, out of the cyclic collector's sight.",
            registry=registry,
        ).set_function(gc.get_freeze_count)
