"""The extender's cluster view: nodes and pods from list + watch, as accounting values.

Each resource runs one loop: list (remembering the list's resourceVersion), then watch from it;
an event carries the version to resume from; a dropped stream resumes from the last version
after a bounded backoff; 410 Expired relists. Pods are applied by UID with a resourceVersion
guard, so a stale event (or a relist older than a patch reply we applied ourselves) never rolls a
pod back. A deleted pod's UID is remembered for a while (UIDs never come back, so a reply about
it that was in flight when it went is stale) and then forgotten: per-pod state stays
proportional to the live pods however many come and go. Local *reservations* (a bind in
flight) sit beside the observed pods and win over them until the bind settles. Below both sit
*tentative* reservations: where the extender expects kube-scheduler to bind a pod it has just
scored (:mod:`kubegpu.extender.inflight`). One pod counts once, by the first of reservation,
observed usage and tentative one it has; the watch drops a pod's tentative one when the pod is
deleted, bound or decided.

Consumers read :attr:`ClusterView.dirty_nodes` (nodes whose usage changed) and
:attr:`ClusterView.topology_version` (bumped when a node appears or disappears; a node whose
allocatable or inventory changed is only marked dirty) to update the placement engine
incrementally.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Node, Pod

from kubegpu.kube.list_watch import (
    Backoff,
    RawNode,
    RawPod,
    keep_listing_and_watching,
    watch_events,
)
from kubegpu.sharing.accounting import (
    ClusterSnapshot,
    NodeInfo,
    PodUsage,
    ReservationHeld,
    snapshot_from,
)
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION, AnnotationError, decode_inventory
from kubegpu.sharing.claim import PodClaim, read_claim
from kubegpu.sharing.podstate import pod_uid, usage_of
from kubegpu.sharing.resources import RequestError, ResourceNames, parse_quantity

log = logging.getLogger(__name__)

_MIB = 2**20


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """A Node's JSON as the accounting sees it; a malformed inventory becomes an error string."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    name = str(meta.get("name") or "")
    try:
        cpu = int(parse_quantity(allocatable.get("cpu", 0)) * 1000)
        memory = int(parse_quantity(allocatable.get("memory", 0)) / _MIB)
    except RequestError as exc:
        log.warning("node %s: unreadable allocatable (%s); treating as empty", name, exc)
        cpu, memory = 0, 0
    raw = (meta.get("annotations") or {}).get(INVENTORY_ANNOTATION)
    if raw is None:
        return NodeInfo(name, cpu, memory)
    try:
        return NodeInfo(name, cpu, memory, decode_inventory(raw))
    except AnnotationError as exc:
        return NodeInfo(name, cpu, memory, None, str(exc))


def _rv(obj: Mapping[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None  # opaque versions: no ordering, accept every event


class ClusterView:
    """Nodes and pods of one cluster, kept current by list + watch."""

    def __init__(
        self,
        client: lightkube.AsyncClient,
        names: ResourceNames | None = None,
        *,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        watch_timeout_s: int = 300,
        tombstone_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.names = names or ResourceNames()
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self.watch_timeout_s = watch_timeout_s
        self.nodes: dict[str, NodeInfo] = {}
        self.observed: dict[str, PodUsage] = {}  # uid -> what the API says the pod holds
        self.reservations: dict[str, PodUsage] = {}  # uid -> a bind in flight
        self.tentative: dict[str, PodUsage] = {}  # uid -> where a scored pod is expected
        self.nominated: dict[str, PodUsage] = {}  # uid -> the cards preemption freed for it
        # The order a pod's usage is taken from: the first of these that holds it.
        self._by_precedence = (self.reservations, self.observed, self.tentative, self.nominated)
        self.pod_json: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> pod
        # (namespace, name) -> the claim read from pod_json's object when it was stored
        self._claims: dict[tuple[str, str], PodClaim] = {}
        self._pod_rv: dict[str, int] = {}  # uid -> newest resourceVersion applied, live pods
        # uid -> when its deletion was applied, oldest first; kept tombstone_s (far longer than
        # any API call whose reply could still be applied: a bind's get / patch / clear).
        self._tombstones: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.tombstone_s = tombstone_s
        self._clock = clock
        self._uid_key: dict[str, tuple[str, str]] = {}
        self.dirty_nodes: set[str] = set()
        self._on_node: dict[str, set[str]] = {}  # node -> uids whose effective usage is there
        self.topology_version = 0
        self.synced = asyncio.Event()
        self._listed: set[str] = set()
        self._versions: dict[str, str | None] = {}
        self.relists = 0
        self.problems: dict[str, str] = {}  # uid -> last problem logged, to log each once

    # ------------------------------------------------------------------ reading
    def usage(self, uid: str) -> PodUsage | None:
        for store in self._by_precedence:
            usage = store.get(uid)
            if usage is not None:
                return usage
        return None

    def usage_stores(self) -> tuple[dict[str, PodUsage], ...]:
        """Copies of the usage maps in the order :meth:`usage` consults them."""
        return tuple(dict(store) for store in self._by_precedence)

    def pods(self) -> dict[str, PodUsage]:
        merged = dict(self.observed)
        merged.update(self.reservations)
        return merged

    def pod_claims(self) -> dict[tuple[str, str], PodClaim]:
        """A copy of each stored pod's claim, by the key of :attr:`pod_json`."""
        return dict(self._claims)

    def claim_of(self, pod: Mapping[str, Any]) -> PodClaim:
        """``pod``'s claim: the one read when the view stored it, when ``pod`` is the object
        in :attr:`pod_json` (a bind reads the pod the watch brought, already parsed once);
        otherwise read now."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        if self.pod_json.get(key) is pod:
            claim = self._claims.get(key)
            if claim is not None:
                return claim
        return read_claim(pod, self.names)

    def snapshot(self) -> ClusterSnapshot:
        return snapshot_from(self.nodes.values(), self.pods().values())

    def usages_on(self, node: str) -> list[PodUsage]:
        found = (self.usage(uid) for uid in self._on_node.get(node, ()))
        return [u for u in found if u is not None]

    def bookkeeping(self) -> dict[str, int]:
        """Entries held per kind of per-pod state: all bounded by the live pods, plus the
        deletions of the last ``tombstone_s`` seconds."""
        return {
            "pods": len(self.pod_json),
            "claims": len(self._claims),
            "uids": len(self._uid_key),
            "versions": len(self._pod_rv),
            "observed": len(self.observed),
            "reservations": len(self.reservations),
            "tentative": len(self.tentative),
            "nominated": len(self.nominated),
            "problems": len(self.problems),
            "tombstones": len(self._tombstones),
            "on_node": sum(len(uids) for uids in self._on_node.values()),
        }

    # ------------------------------------------------------------------ local writes
    def reserve(self, usage: PodUsage) -> None:
        """Hold ``usage`` for a bind in flight; raises :class:`ReservationHeld` when another
        reservation of the pod is still held. Reservations are keyed by UID, so a second one
        would silently replace the first, and the cards of whichever bind lands first would
        look free to the next pod (the extender runs one bind of a pod at a time for this)."""
        if usage.uid in self.reservations:
            raise ReservationHeld(f"pod {usage.key}: another bind of it is still in flight")
        previous = self.usage(usage.uid)
        self.reservations[usage.uid] = usage
        self._touch(previous, usage)

    def unreserve(self, uid: str) -> None:
        usage = self.reservations.pop(uid, None)
        if usage is not None:
            self._touch(usage, self.usage(uid))

    def hold_tentative(self, usage: PodUsage) -> None:
        """Expect the pod on ``usage.node`` until a bind settles it: counted like a reservation
        while the pod holds nothing else, replacing an earlier tentative one of the pod."""
        self._hold(self.tentative, usage)

    def drop_tentative(self, uid: str) -> PodUsage | None:
        """Forget the pod's tentative reservation; returns it (None: it had none)."""
        return self._drop(self.tentative, uid)

    def hold_nominated(self, usage: PodUsage) -> None:
        """Hold the cards preemption freed for a waiting pod (its victims still terminating):
        counted like a reservation while the pod holds nothing else, so other pods are not
        placed there meanwhile."""
        self._hold(self.nominated, usage)

    def drop_nominated(self, uid: str) -> PodUsage | None:
        """Release the pod's nomination hold; returns it (None: it had none)."""
        return self._drop(self.nominated, uid)

    def _hold(self, store: dict[str, PodUsage], usage: PodUsage) -> None:
        """Put ``usage`` in one of the lower-ranked stores (see :meth:`usage`), replacing the
        pod's earlier entry there, and mark the nodes whose usage changed."""
        before = self.usage(usage.uid)
        store[usage.uid] = usage
        self._touch(before, self.usage(usage.uid))

    def _drop(self, store: dict[str, PodUsage], uid: str) -> PodUsage | None:
        before = self.usage(uid)
        usage = store.pop(uid, None)
        if usage is not None:
            self._touch(before, self.usage(uid))
        return usage

    def _touch(self, before: PodUsage | None, after: PodUsage | None) -> None:
        if before == after:
            return
        if before is not None:
            self.dirty_nodes.add(before.node)
            self._on_node.get(before.node, set()).discard(before.uid)
        if after is not None:
            self.dirty_nodes.add(after.node)
            self._on_node.setdefault(after.node, set()).add(after.uid)

    # ------------------------------------------------------------------ applying objects
    def apply_pod(self, pod: Mapping[str, Any], *, deleted: bool = False) -> None:
        uid = pod_uid(pod)
        if not uid:
            return
        if uid in self._tombstones:
            return  # deleted already: a reply that was in flight when it went
        rv = _rv(pod)
        last = self._pod_rv.get(uid)
        if rv is not None and last is not None and rv < last:
            return  # older than what we already applied (e.g. our own patch reply)
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        before = self.usage(uid)
        if deleted:
            self.observed.pop(uid, None)
            self.tentative.pop(uid, None)
            self.nominated.pop(uid, None)
            if pod_uid(self.pod_json.get(key) or {}) == uid:
                self.pod_json.pop(key)  # not a namesake created since
                self._claims.pop(key, None)
            self._uid_key.pop(uid, None)
            self.problems.pop(uid, None)
            self._pod_rv.pop(uid, None)
            self._bury(uid)
        else:
            if rv is not None:
                self._pod_rv[uid] = rv
            stored = dict(pod)
            claim = read_claim(stored, self.names)
            self.pod_json[key] = stored
            self._claims[key] = claim
            self._uid_key[uid] = key
            reading = usage_of(claim, self.names)
            if reading.problem and self.problems.get(uid) != reading.problem:
                self.problems[uid] = reading.problem
                log.warning("%s", reading.problem)
            if reading.usage is None:
                self.observed.pop(uid, None)
            else:
                self.observed[uid] = reading.usage
            if reading.usage is not None or (pod.get("spec") or {}).get("nodeName"):
                self.tentative.pop(uid, None)  # bound or decided: what it holds is known now
                self.nominated.pop(uid, None)
        self._touch(before, self.usage(uid))

    async def resync_pods(self) -> None:
        """List the pods again now and apply the list: everything written before this call is
        in the view when it returns (a watch may lag behind). The watch goes on; the
        resourceVersion guard keeps whichever of the two is newer for each pod."""
        await self._relist(Pod, "pods")

    def _bury(self, uid: str) -> None:
        now = self._clock()
        self._tombstones[uid] = now
        self._tombstones.move_to_end(uid)
        while self._tombstones:
            oldest, when = next(iter(self._tombstones.items()))
            if now - when <= self.tombstone_s:
                break
            del self._tombstones[oldest]

    def apply_node(self, node: Mapping[str, Any], *, deleted: bool = False) -> None:
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            return
        if deleted:
            if self.nodes.pop(name, None) is not None:
                self.topology_version += 1
            return
        info = node_info(node)
        previous = self.nodes.get(name)
        if previous == info:
            return
        if info.inventory_error and (
            previous is None or previous.inventory_error != info.inventory_error
        ):
            log.warning("node %s: %s; its GPUs are not offered", name, info.inventory_error)
        self.nodes[name] = info
        if previous is None:
            self.topology_version += 1
        else:
            self.dirty_nodes.add(name)

    # ------------------------------------------------------------------ list + watch
    async def run(self) -> None:
        """List and watch nodes and pods until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._loop(Node, "nodes"))
            group.create_task(self._loop(Pod, "pods"))

    async def _loop(self, kind: type[Node] | type[Pod], label: str) -> None:
        await keep_listing_and_watching(
            label,
            self._versions,
            lambda: self._relist(kind, label),
            lambda: self._watch(kind, label),
            self.backoff,
            self._sleep,
        )

    async def _relist(self, kind: type[Node] | type[Pod], label: str) -> str:
        # Listed as plain JSON, the form the watch gives (list_watch.RawNode).
        listing = self.client.list(RawNode if kind is Node else RawPod, **_every_namespace(kind))
        objects = [dict(obj) async for obj in listing]
        version = listing.resourceVersion
        listed_rv = int(version) if version.isdigit() else None
        if kind is Node:
            present = {o["metadata"]["name"] for o in objects}
            for name in [n for n in self.nodes if n not in present]:
                self.apply_node({"metadata": {"name": name}}, deleted=True)
            for obj in objects:
                self.apply_node(obj)
        else:
            present = {o["metadata"].get("uid") for o in objects}
            # Every pod known, not only those holding GPUs: a deletion missed while the watch
            # was down must not leave its entries behind for ever.
            known = set(self._uid_key) | set(self.observed)
            for uid in [u for u in known if u not in present]:
                last = self._pod_rv.get(uid)
                if listed_rv is None or last is None or last <= listed_rv:
                    key = self._uid_key.get(uid, ("", ""))
                    self.apply_pod(
                        {"metadata": {"uid": uid, "namespace": key[0], "name": key[1]}},
                        deleted=True,
                    )
            for obj in objects:
                self.apply_pod(obj)
        self.relists += 1
        self._listed.add(label)
        if self._listed >= {"nodes", "pods"}:
            self.synced.set()
        log.info("listed %d %s at version %s", len(objects), label, version)
        return version

    async def _watch(self, kind: type[Node] | type[Pod], label: str) -> None:
        # lightkube re-opens a stream the server closed cleanly, from the last version it saw;
        # errors come out here and _loop resumes from the version recorded below.
        stream = watch_events(
            self.client,
            kind,
            resource_version=self._versions[label],
            server_timeout=self.watch_timeout_s,
            **_every_namespace(kind),
        )
        async for event, data in stream:
            rv = (data.get("metadata") or {}).get("resourceVersion")
            if rv:
                self._versions[label] = rv
            if event == "BOOKMARK":
                continue
            if kind is Node:
                self.apply_node(data, deleted=event == "DELETED")
            else:
                self.apply_pod(data, deleted=event == "DELETED")


def _every_namespace(kind: type[Node] | type[Pod]) -> dict[str, Any]:
    # lightkube lists and watches a namespaced kind in the client's own namespace unless told
    # "*"; a cluster-scoped kind takes no namespace.
    return {"namespace": "*"} if kind is Pod else {}
