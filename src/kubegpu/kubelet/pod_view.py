"""This node's pods as the node agent's sharing coordinator sees them: one LIST, then a watch.

The view keeps every pod bound to this node (``spec.nodeName`` field selector) current, so the
withdrawn device ids follow the pods without a LIST per node every few seconds. A list and the
watch may each be ahead of the other: per pod the newer ``resourceVersion`` wins, and a pod
deleted at some version is remembered (a tombstone) so a late event cannot revive it. Without
RBAC ``watch`` the view polls with LISTs instead; a 410 Gone lists again. Every change calls
``on_change`` (the coordinator recomputes the withdrawn ids); a pod that leaves also sets
``pod_left``, for the reconcile loop to give its devices back at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubegpu.kubelet.cluster import NodeApi
from kubegpu.kubelet.shares import NodePod, read_node_pod
from kubegpu.sharing.podstore import PodStoreError
from kubegpu.sharing.resources import ResourceNames

# A child of the coordinator's logger: these lines were the coordinator's, and a log filter
# or level set on it still covers them.
log = logging.getLogger("kubegpu.kubelet.coordinator.pods")

WATCH_TIMEOUT_S = 300  # the server ends each watch stream after this; lightkube re-opens it
TOMBSTONES = 1024
FORBIDDEN_POLL_S = 300.0  # without RBAC watch: poll this long before trying to watch again


class NodePodView:
    """This node's pods; changed only under ``lock`` (the coordinator's allocation lock)."""

    def __init__(
        self,
        node: str,
        api: NodeApi,
        names: ResourceNames,
        lock: asyncio.Lock,
        on_change: Callable[[], None],
        *,
        sync_interval_s: float,
    ) -> None:
        self.node = node
        self.api = api
        self.names = names
        self.lock = lock
        self._on_change = on_change
        self.sync_interval_s = sync_interval_s
        self.pods: list[NodePod] = []
        # Where the watch resumes from (None: list first), pods deleted at which version.
        self.resume_from: str | None = None
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self.relists = 0
        self.synced = asyncio.Event()  # set once the first list is in
        # Set when a pod of this node is deleted or finishes: its cards' withdrawn ids must be
        # given back now, not at the next reconcile round (the real kubelet turns a pod bound
        # meanwhile away for good when the only ids left for it are unhealthy).
        self.pod_left = asyncio.Event()
        self.forbidden_poll_s = FORBIDDEN_POLL_S
        self._problems: dict[str, str] = {}

    async def refresh(self) -> None:
        """Re-read this node's pods with a LIST (raises on API errors).

        A consistent read, for the calls that must see every pod bound so far: the kubelet
        admits a pod as soon as its own watch shows it bound, and the agent's watch may be a
        moment behind. Everything else uses the view the watch keeps (:meth:`watch`)."""
        listing = await self.api.list_node_pods()
        self.take_listing(listing.pods, listing.resource_version)

    def take_listing(self, raw: Sequence[Mapping[str, Any]], version: str) -> None:
        listed = _version(version)
        current = {p.uid: p for p in self.pods}
        pods: list[NodePod] = []
        seen: set[str] = set()
        for item in raw:
            pod = read_node_pod(item, self.node, self.names)
            seen.add(pod.uid)
            old = current.get(pod.uid)
            # Per pod the newer of the list and the watch wins (the watch may be ahead).
            pods.append(old if old is not None and _newer(old, pod, unknown=False) else pod)
        for uid, old in current.items():
            if uid in seen:
                continue
            if listed is not None and (_version(old.resource_version) or 0) > listed:
                pods.append(old)  # written after the list was taken: the watch knows better
            elif listed is not None:
                self._bury(uid, listed)
        for pod in pods:
            self._note_problem(pod)
        self.pods = pods
        self._on_change()

    def _note_problem(self, pod: NodePod) -> None:
        if pod.problem and self._problems.get(pod.uid) != pod.problem:
            self._problems[pod.uid] = pod.problem
            log.warning("node %s: %s", self.node, pod.problem)

    def _bury(self, uid: str, version: int) -> None:
        """Remember a pod gone at ``version``, so a late event about it does not revive it."""
        self._tombstones[uid] = version
        self._tombstones.move_to_end(uid)
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    def apply_event(self, event: str, raw: Mapping[str, Any]) -> None:
        pod = read_node_pod(raw, self.node, self.names)
        if not pod.uid:
            return
        current = next((p for p in self.pods if p.uid == pod.uid), None)
        if current is not None and not _newer(pod, current, unknown=True):
            return  # a list or an earlier event already gave us this version or a newer one
        version = _version(pod.resource_version)
        if event == "DELETED" or pod.terminal:
            self.pod_left.set()
        if event == "DELETED":
            self.pods = [p for p in self.pods if p.uid != pod.uid]
            if version is not None:
                self._bury(pod.uid, version)
        else:
            dead = self._tombstones.get(pod.uid)
            if dead is not None and (version is None or version <= dead):
                return
            self._note_problem(pod)
            if current is None:
                self.pods = [*self.pods, pod]
            else:
                self.pods = [pod if p.uid == pod.uid else p for p in self.pods]
        self._on_change()

    async def refresh_or_keep(self, why: str) -> None:
        try:
            await self.refresh()
        except Exception as err:  # the API being down must not stop whole-GPU pods
            log.warning(
                "node %s: cannot read pods for %s (%s); using the last view", self.node, why, err
            )

    async def watch(self) -> None:
        """Keep this node's pods current: one LIST, then a watch from its resourceVersion
        (field selector spec.nodeName), resumed from the last version seen after an error (with
        a growing pause, ``syncIntervalS`` times the failures in a row, at most ten times it)
        and listed again only when the server answers 410 Gone (that version fell out of its
        history). Polling instead cost one LIST per node every ``syncIntervalS``, about 240 a
        second on a 1,213-node cluster."""
        retry_s = self.sync_interval_s
        failures = 0
        while True:
            try:
                if self.resume_from is None:
                    listing = await self.api.list_node_pods()
                    async with self.lock:
                        self.take_listing(listing.pods, listing.resource_version)
                    self.resume_from = listing.resource_version
                    self.relists += 1
                    self.synced.set()
                async for event, raw in self.api.watch_node_pods(self.resume_from, WATCH_TIMEOUT_S):
                    version = (raw.get("metadata") or {}).get("resourceVersion")
                    if version:
                        self.resume_from = str(version)
                    failures = 0
                    if event in ("ADDED", "MODIFIED", "DELETED"):
                        async with self.lock:
                            self.apply_event(event, raw)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the API being away must not end the loop
                code = _status_code(err)
                if code == 403:
                    log.warning(
                        "node %s: may not watch this node's pods (%s); listing them every %.1f s "
                        "instead (RBAC: the node agent's ClusterRole needs watch on pods)",
                        self.node,
                        err,
                        retry_s,
                    )
                    await self._poll(self.forbidden_poll_s)
                    self.resume_from = None
                    continue
                if code == 410:
                    log.info(
                        "node %s: pod watch expired at version %s; listing again",
                        self.node,
                        self.resume_from,
                    )
                    self.resume_from = None
                    continue
                failures += 1
                delay = min(retry_s * failures, retry_s * 10)
                log.warning(
                    "node %s: watching this node's pods failed (%s); retrying in %.1f s",
                    self.node,
                    str(err) or type(err).__name__,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _poll(self, duration_s: float) -> None:
        """List the pods every ``syncIntervalS`` for ``duration_s``: the watch's stand-in while
        the API server refuses it (an older ClusterRole without ``watch``)."""
        retry_s = self.sync_interval_s
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            try:
                listing = await self.api.list_node_pods()
                async with self.lock:
                    self.take_listing(listing.pods, listing.resource_version)
                self.relists += 1
            except Exception as err:
                log.warning("node %s: cannot list this node's pods: %s", self.node, err)
            await asyncio.sleep(retry_s)


def _version(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _newer(a: NodePod, b: NodePod, *, unknown: bool) -> bool:
    """``a`` is a later version of the pod than ``b``; ``unknown`` when either version is not
    an integer (the API server's are, but the API calls them opaque)."""
    va, vb = _version(a.resource_version), _version(b.resource_version)
    return unknown if va is None or vb is None else va > vb


def _status_code(err: Exception) -> int | None:
    """The HTTP status an API error carries, without importing a client library here: ours
    (:class:`~kubegpu.sharing.podstore.PodStoreError`), else the ``status.code`` (lightkube)
    or ``response.status_code`` (httpx) of the error the :class:`NodeApi` in use raised."""
    if isinstance(err, PodStoreError):
        return err.code
    for holder, field in (("status", "code"), ("response", "status_code")):
        code = getattr(getattr(err, holder, None), field, None)
        if isinstance(code, int):
            return code
    return None
