"""Card-level sharing on the node: Allocate for share slots, whole/shared collision guard,
and reconciliation against the kubelet's PodResources API.

One :class:`SharingCoordinator` per agent (``sharing.gpuShare.enabled``). It answers
``GetPreferredAllocation`` and ``Allocate`` for every resource of the node:

* share slots: the pending pod is resolved as :mod:`kubegpu.kubelet.shares` describes, its
  ledger annotation (``kubegpu.io/gpu-allocated``) is written *before* the answer goes back, and
  the container is told its card and share (plus the MPS limits in ``mps`` mode);
* whole GPUs: steered to the extender's decision when there is one, and refused on a card that
  holds shares.

This node's pods come from one LIST and then a watch (``spec.nodeName`` field selector), which
keeps the withdrawn ids current; ``GetPreferredAllocation`` and ``Allocate`` LIST again, since
they must see a pod the kubelet admits the moment its own watch shows it bound.

Whole GPUs and shares never meet on one card, by three layers (docs/sharing.md): the extender's
accounting never decides it; the coordinator withdraws the ids that would allow it (a card
holding shares reports its whole-GPU id Unhealthy, so the kubelet cannot pick it; a card in
whole use keeps its share slots, see ``_update_blocked``); and ``Allocate`` verifies and
refuses. Allocations
are serialised by one lock: the kubelet admits pods one at a time anyway, and the ledger read +
write must not interleave.

Reconciliation lists the kubelet's PodResources (which knows pod ↔ slot for sidecars and app
containers; regular init containers are never listed, so what was recorded for them stays
unverified, and whole-GPU ones follow the containers they handed their cards to) and makes the
records follow it (:mod:`kubegpu.kubelet.records`): a container the kubelet gave another pod's
share exchanges records with that pod, a container missing from a ledger is recorded, whole-GPU
decisions are set to the cards held; the pods' ``kubegpu.io/gpu-allocation`` then says what
runs (the extender only writes it before binding, so the agent is its sole writer afterwards)
and the extender's accounting is the truth. Every repair is logged with node, pod and card
and noted in the pod's ``kubegpu.io/gpu-drift`` annotation; a share of another size than asked
for also in ``kubegpu.io/gpu-share-mismatch``. ``Allocate`` runs the same repairs first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import GpuUuid
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.cluster import ConflictError, DeviceHolding, NodeApi, PodResourcesApi
from kubegpu.kubelet.records import Holdings, Repair, follow_share_holdings, follow_whole_holdings
from kubegpu.kubelet.resources import (
    AllocateAnswer,
    AllocationError,
    AllocationRefused,
    BindMount,
    ResourcePlan,
    card_of,
)
from kubegpu.kubelet.shares import (
    MpsPaths,
    NodePod,
    describe_pending,
    pending_share_pods,
    preferred_whole_cards,
    read_node_pod,
    share_candidates,
    share_cards,
    share_env,
    whole_decision_cards,
)
from kubegpu.sharing.annotations import CardShare
from kubegpu.sharing.claim import annotation_patch, grant, reconcile
from kubegpu.sharing.findings import findings
from kubegpu.sharing.ledger import GrantedContainer
from kubegpu.sharing.podstore import PodStoreError
from kubegpu.sharing.resources import ResourceNames

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
WATCH_TIMEOUT_S = 300  # the server ends each watch stream after this; lightkube re-opens it
TOMBSTONES = 1024
FORBIDDEN_POLL_S = 300.0  # without RBAC watch: poll this long before trying to watch again
POD_LEFT_FOLLOW_UP_S = 2.0  # after a pod left: one more reconcile this much later


def _now_rfc3339(clock: Callable[[], float]) -> str:
    return datetime.fromtimestamp(clock(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resource_names(config: AgentConfig) -> ResourceNames:
    share = config.sharing.gpu_share
    return ResourceNames(
        whole_gpu=share.whole_resource_name,
        gpu_memory=share.memory_resource_name,
        gpu_compute=share.compute_resource_name,
        share_slot=share.resource_name,
    )


class SharingCoordinator:
    def __init__(
        self,
        node: str,
        config: AgentConfig,
        api: NodeApi,
        board: DeviceBoard,
        *,
        pod_resources: PodResourcesApi | None = None,
        mps: MpsPaths | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.config = config
        self.api = api
        self.board = board
        self.pod_resources = pod_resources
        self.mps = mps
        self.clock = clock
        self.names = resource_names(config)
        self.plans: list[ResourcePlan] = []
        self.pods: list[NodePod] = []
        self.lock = asyncio.Lock()
        # What the kubelet reported at the last PodResources List (card UUIDs).
        self.kubelet_share_cards: set[str] = set()
        self.kubelet_whole_cards: set[str] = set()
        # Whole cards we handed out since (card -> when): the kubelet's truth catches up later.
        self.recent_whole: dict[str, float] = {}
        self.drift_count = 0
        self.mismatch_count = 0
        # The watch: where it resumes from (None: list first), pods deleted at which version.
        self._version: str | None = None
        self._tombstones: OrderedDict[str, int] = OrderedDict()
        self.relists = 0
        self.synced = asyncio.Event()  # set once the first list is in
        # Set when a pod of this node is deleted or finishes: its cards' withdrawn ids must be
        # given back now, not at the next reconcile round (the real kubelet turns a pod bound
        # meanwhile away for good when the only ids left for it are unhealthy).
        self._pod_left = asyncio.Event()
        self.forbidden_poll_s = FORBIDDEN_POLL_S
        self._problems: dict[str, str] = {}
        self._collisions: set[str] = set()

    def set_plans(self, plans: Sequence[ResourcePlan]) -> None:
        self.plans = list(plans)
        self._update_blocked()

    # -- reading ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Re-read this node's pods with a LIST (raises on API errors).

        A consistent read, for the calls that must see every pod bound so far: the kubelet
        admits a pod as soon as its own watch shows it bound, and the agent's watch may be a
        moment behind. Everything else uses the view the watch keeps (:meth:`_watch`)."""
        listing = await self.api.list_node_pods()
        self._take_listing(listing.pods, listing.resource_version)

    def _take_listing(self, raw: Sequence[Mapping[str, Any]], version: str) -> None:
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
        self._update_blocked()

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

    def _apply_event(self, event: str, raw: Mapping[str, Any]) -> None:
        pod = read_node_pod(raw, self.node, self.names)
        if not pod.uid:
            return
        current = next((p for p in self.pods if p.uid == pod.uid), None)
        if current is not None and not _newer(pod, current, unknown=True):
            return  # a list or an earlier event already gave us this version or a newer one
        version = _version(pod.resource_version)
        if event == "DELETED" or pod.terminal:
            self._pod_left.set()
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
        self._update_blocked()

    async def _refresh_or_keep(self, why: str) -> None:
        try:
            await self.refresh()
        except Exception as err:  # the API being down must not stop whole-GPU pods
            log.warning(
                "node %s: cannot read pods for %s (%s); using the last view", self.node, why, err
            )

    def share_cards(self) -> dict[str, list[str]]:
        cards = share_cards(self.pods)
        for uuid in self.kubelet_share_cards:
            cards.setdefault(uuid, ["(kubelet PodResources)"])
        return cards

    def whole_cards(self) -> dict[str, str]:
        cards = whole_decision_cards(self.pods)
        for uuid in self.kubelet_whole_cards:
            cards.setdefault(uuid, "(kubelet PodResources)")
        for uuid in self.recent_whole:
            cards.setdefault(uuid, "(allocated whole by this agent)")
        return cards

    def _update_blocked(self) -> None:
        shares = self.share_cards()
        wholes = self.whole_cards()
        collisions = set(shares) & set(wholes)
        new, self._collisions = collisions - self._collisions, collisions
        for uuid in sorted(new):  # once per collision, not on every sync
            log.error(
                "node %s: card %s is both shared (%s) and whole (%s); its whole-GPU id is "
                "withdrawn",
                self.node,
                uuid,
                ", ".join(shares[uuid]),
                wholes[uuid],
            )
        for plan in self.plans:
            if plan.share_slots:
                # Share slots are never withdrawn: kube-scheduler never retries a shared pod
                # that NodeResourcesFit turned away for want of slots when the node's count
                # comes back (its queueing hint counts the memory and compute resources the
                # extender manages as missing from the node), so the pod would wait for the
                # five-minute flush. The extender never puts a share on a card in whole use,
                # GetPreferredAllocation steers to the decided card, and Allocate refuses.
                continue
            cards = {g.uuid for g in plan.gpus}
            blocked = frozenset(GpuUuid(u) for u in shares if u in cards)
            if self.board.set_blocked(plan.resource_name, blocked):
                log.info(
                    "node %s resource %s: withdrawn cards now %s",
                    self.node,
                    plan.resource_name,
                    ",".join(sorted(blocked)) or "none",
                )

    # -- AllocationHooks ---------------------------------------------------------------------

    def handles(self, plan: ResourcePlan) -> bool:
        return True

    async def preferred(
        self, plan: ResourcePlan, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...] | None:
        if must_include:
            return None  # reuse of an init container's ids: the plan's answer keeps them
        async with self.lock:
            await self._refresh_or_keep("a preferred allocation")
            holdings = await self._holdings("a preferred allocation")
            # What the records will say once PodResources' truth is written back.
            pods = self._followed(holdings)
            if plan.share_slots:
                held = None if holdings is None else self._held_pods(holdings, slots=True)
                for candidate in share_candidates(pods, None, held):
                    card = candidate.share.uuid
                    ids = sorted(
                        (i for i in available if card_of(i) == card),
                        key=lambda i: plan.lookup(i).replica or 0,
                    )
                    if len(ids) >= size:
                        log.info(
                            "node %s: steering %s to card %s for pod %s",
                            self.node,
                            plan.resource_name,
                            card,
                            candidate.pod.key,
                        )
                        return tuple(ids[:size])
                    if candidate.admitting:
                        return None  # Allocate will refuse a slot of another card
                return None
            if holdings is not None:
                admitted = self._held_pods(holdings, slots=False)
                pods = [p for p in pods if (p.namespace, p.name) not in admitted]
            by_card = {str(card_of(i)): i for i in available if plan.lookup(i).replica is None}
            cards = preferred_whole_cards(pods, set(by_card), size)
            if cards is not None:
                return tuple(by_card[c] for c in cards)
            # No decision (placed by another scheduler): the extender assumes such a pod holds
            # the highest-index free cards, so make that true rather than guess topology.
            if len(by_card) < size:
                return None
            ordered = sorted(by_card.values(), key=lambda i: -plan.lookup(i).gpu.index)
            return tuple(ordered[:size])

    async def allocate(self, plan: ResourcePlan, device_ids: Sequence[str]) -> AllocateAnswer:
        for device_id in device_ids:
            plan.lookup(device_id)  # unknown ids: INVALID_ARGUMENT, as without sharing
        async with self.lock:
            if plan.share_slots:
                return await self._allocate_share(plan, device_ids)
            return await self._allocate_whole(plan, device_ids)

    async def _allocate_whole(
        self, plan: ResourcePlan, device_ids: Sequence[str]
    ) -> AllocateAnswer:
        await self._refresh_or_keep("a whole-GPU allocation")
        shares = self.share_cards()
        for device_id in device_ids:
            card = card_of(device_id)
            if card in shares:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: card {card} holds GPU shares of "
                    f"{', '.join(shares[card])}; refusing to hand it out whole as "
                    f"{plan.resource_name} (device {device_id})",
                )
        alloc = plan.allocate(self.config, device_ids)
        now = self.clock()
        for device_id in device_ids:
            self.recent_whole[card_of(device_id)] = now
        self._update_blocked()
        return alloc

    async def _allocate_share(
        self, plan: ResourcePlan, device_ids: Sequence[str]
    ) -> AllocateAnswer:
        if len(device_ids) != 1:
            raise AllocationError(
                f"node {self.node}: a sharing container asks for exactly 1 {plan.resource_name}, "
                f"got {len(device_ids)} ({', '.join(device_ids)})"
            )
        slot = device_ids[0]
        card = card_of(slot)
        for _ in range(CONFLICT_RETRIES):
            try:
                await self.refresh()
            except Exception as err:
                raise AllocationRefused(
                    "UNAVAILABLE",
                    f"node {self.node}: cannot read this node's pods from the API server to find "
                    f"the pod for share slot {slot}: {err}",
                ) from err
            holdings = await self._holdings(f"share slot {slot}")
            if holdings is not None:
                # Records first follow what the kubelet really gave (an earlier Allocate may
                # have served another pod than the one admitted): the share handed out below
                # must come from records that are true.
                repairs = self._share_repairs(holdings)
                if repairs:
                    await self._apply(repairs)
                    continue
            wholes = self.whole_cards()
            if card in wholes:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: card {card} is in use as a whole GPU by {wholes[card]}; "
                    f"refusing share slot {slot}",
                )
            held = None if holdings is None else self._held_pods(holdings, slots=True)
            candidates = share_candidates(self.pods, card, held, slot)
            if not candidates:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: share slot {slot}: no pending pod has a kubegpu decision "
                    f"(kubegpu.io/gpu-allocation) for card {card} with a container still to "
                    f"allocate ({describe_pending(pending_share_pods(self.pods))}); is the pod "
                    "scheduled through the kubegpu scheduler extender?",
                )
            chosen = candidates[0]
            pod, container, share = chosen.pod, chosen.container, chosen.share
            if share.uuid != card:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: share slot {slot} is on card {card}, but the kubelet is "
                    f"admitting pod {pod.key}, whose container {container} has its share on "
                    f"card {share.uuid} ({share.gpu_memory_mib} MiB, {share.compute_milli} milli); "
                    f"refusing rather than over-committing card {card} (no free share slot "
                    f"left on card {share.uuid}? raise sharing.gpuShare.slotsPerCard)",
                )
            granted = GrantedContainer(
                container,
                card,
                slot,
                share.compute_milli,
                share.gpu_memory_mib,
                _now_rfc3339(self.clock),
            )
            claim = grant(pod.claim, granted, self.node)
            try:
                await self.api.patch_pod_annotations(
                    pod.namespace,
                    pod.name,
                    annotation_patch(pod.claim, claim),
                    pod.resource_version,
                )
            except ConflictError:
                log.info("node %s: pod %s changed while allocating; re-reading", self.node, pod.key)
                continue
            except Exception as err:
                raise AllocationRefused(
                    "UNAVAILABLE",
                    f"node {self.node}: cannot record the allocation of card {card} on pod "
                    f"{pod.key}: {err}",
                ) from err
            self.pods = [replace(p, claim=claim) if p.uid == pod.uid else p for p in self.pods]
            self._update_blocked()
            log.info(
                "node %s: pod %s container %s gets card %s (share slot %s, %d MiB, %d milli%s)",
                self.node,
                pod.key,
                container,
                card,
                slot,
                share.gpu_memory_mib,
                share.compute_milli,
                ", PodResources shows the kubelet admitting it" if chosen.admitting else "",
            )
            return self._answer(plan, slot, share)
        raise AllocationRefused(
            "ABORTED",
            f"node {self.node}: share slot {slot}: pods kept changing while recording the "
            "allocation; the kubelet will fail this pod's admission",
        )

    def _answer(self, plan: ResourcePlan, slot: str, share: CardShare) -> AllocateAnswer:
        """The container's answer: the slot's devices, told ``share`` (the decided share,
        exactly what was just recorded as granted)."""
        base = plan.allocate(self.config, [slot])
        enforcement = self.config.sharing.gpu_share.enforcement
        envs = {**base.envs, **share_env(share.uuid, share, enforcement, self.mps)}
        mounts = list(base.mounts)
        if enforcement == "mps" and self.mps is not None:
            # Read-write: MPS clients open the daemon's pipes for writing.
            mounts.append(BindMount(self.mps.pipe_dir, self.mps.pipe_dir, read_only=False))
            mounts.append(BindMount(self.mps.log_dir, self.mps.log_dir, read_only=False))
        return replace(base, envs=envs, mounts=tuple(mounts))

    # -- reconciliation ----------------------------------------------------------------------

    async def _holdings(self, why: str) -> list[DeviceHolding] | None:
        """The kubelet's PodResources answer, or ``None`` without one (not configured, or the
        kubelet did not answer: the ledgers alone then decide, as before PodResources)."""
        if self.pod_resources is None:
            return None
        try:
            return await self.pod_resources.list_holdings()
        except Exception as err:
            log.warning(
                "node %s: cannot list the kubelet's PodResources for %s (%s); going by the "
                "pods' ledgers alone",
                self.node,
                why,
                err,
            )
            return None

    def _resources(self, *, slots: bool) -> set[str]:
        return {p.resource_name for p in self.plans if p.share_slots == slots}

    def _holdings_of(self, holdings: Sequence[DeviceHolding], *, slots: bool) -> Holdings:
        names = self._resources(slots=slots)
        return {
            (h.namespace, h.pod, h.container): h.device_ids
            for h in holdings
            if h.resource in names and h.device_ids
        }

    def _held_pods(
        self, holdings: Sequence[DeviceHolding], *, slots: bool
    ) -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for namespace, pod, container in self._holdings_of(holdings, slots=slots):
            out.setdefault((namespace, pod), set()).add(container)
        return out

    def _cards(self) -> dict[str, tuple[int, int]]:
        return {g.uuid: (g.index, g.memory_total_mib) for p in self.plans for g in p.gpus}

    def _share_repairs(self, holdings: Sequence[DeviceHolding]) -> list[Repair]:
        return follow_share_holdings(
            self.pods,
            self._holdings_of(holdings, slots=True),
            node=self.node,
            index_of={u: i for u, (i, _) in self._cards().items()},
            now=_now_rfc3339(self.clock),
        )

    def _repairs(self, holdings: Sequence[DeviceHolding]) -> list[Repair]:
        shares = self._share_repairs(holdings)
        wholes = follow_whole_holdings(
            self.pods,
            self._holdings_of(holdings, slots=False),
            cards=self._cards(),
            shared=set(self.share_cards()),
        )
        return shares + wholes

    def _followed(self, holdings: Sequence[DeviceHolding] | None) -> list[NodePod]:
        """This node's pods as their records will be once they follow ``holdings``."""
        if holdings is None:
            return self.pods
        repairs = {r.pod.uid: r for r in self._repairs(holdings)}
        return [_repaired(p, repairs[p.uid]) if p.uid in repairs else p for p in self.pods]

    async def reconcile(self) -> int:
        """Make the pods' records follow the kubelet's PodResources; returns how many problems
        were found."""
        if self.pod_resources is None:
            return 0
        started = self.clock()
        holdings = await self.pod_resources.list_holdings()
        self.kubelet_share_cards = {
            card_of(i) for ids in self._holdings_of(holdings, slots=True).values() for i in ids
        }
        self.kubelet_whole_cards = {
            card_of(i) for ids in self._holdings_of(holdings, slots=False).values() for i in ids
        }
        # Allocations older than this listing are in it (or already gone again).
        self.recent_whole = {c: t for c, t in self.recent_whole.items() if t > started}
        async with self.lock:
            if self._version is None:
                await self.refresh()  # no watch running (yet): read the pods now
            listed = {(p.namespace, p.name) for p in self.pods if not p.terminal}
            for key in sorted(self._held_pods(holdings, slots=True)):
                if key not in listed:
                    log.warning(
                        "node %s: the kubelet reports shares for pod %s/%s, which the API "
                        "server does not list on this node",
                        self.node,
                        *key,
                    )
            found = await self._apply(self._repairs(holdings))
            self._update_blocked()
        return found

    async def _apply(self, repairs: Sequence[Repair]) -> int:
        """Write ``repairs`` in order (holders of exchanged shares first, see
        :mod:`kubegpu.kubelet.records`); stops at the first pod that changed meanwhile (the
        next round re-reads and finishes). Returns how many findings were written."""
        found = 0
        now = _now_rfc3339(self.clock)
        for repair in repairs:
            pod = repair.pod
            repaired = reconcile(
                pod.claim,
                decision=repair.decision,
                ledger=repair.ledger,
                drift=findings(now, repair.notes),
                mismatch=findings(now, repair.mismatches),
            )
            try:
                await self.api.patch_pod_annotations(
                    pod.namespace,
                    pod.name,
                    annotation_patch(pod.claim, repaired),
                    pod.resource_version,
                )
            except ConflictError:
                log.info("node %s: pod %s changed during reconcile; next round", self.node, pod.key)
                break
            for note in repair.notes:
                log.warning("node %s: pod %s: %s", self.node, pod.key, note)
            for mismatch in repair.mismatches:
                log.warning("node %s: pod %s: GPU share mismatch: %s", self.node, pod.key, mismatch)
            if not repair.notes:
                log.info("node %s: pod %s: PodResources confirms its cards", self.node, pod.key)
            found += len(repair.notes) + len(repair.mismatches)
            self.drift_count += len(repair.notes)
            self.mismatch_count += len(repair.mismatches)
            self.pods = [_repaired(p, repair) if p.uid == pod.uid else p for p in self.pods]
        return found

    # -- loops ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the withdrawn ids and the ledgers current until cancelled."""
        share = self.config.sharing.gpu_share
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch())
            if self.pod_resources is not None:
                group.create_task(self._reconcile_loop(share.reconcile_interval_s))

    async def _watch(self) -> None:
        """Keep this node's pods current: one LIST, then a watch from its resourceVersion
        (field selector spec.nodeName), resumed from the last version seen after an error (with
        a growing pause, ``syncIntervalS`` times the failures in a row, at most ten times it)
        and listed again only when the server answers 410 Gone (that version fell out of its
        history). Polling instead cost one LIST per node every ``syncIntervalS``, about 240 a
        second on a 1,213-node cluster."""
        retry_s = self.config.sharing.gpu_share.sync_interval_s
        failures = 0
        while True:
            try:
                if self._version is None:
                    listing = await self.api.list_node_pods()
                    async with self.lock:
                        self._take_listing(listing.pods, listing.resource_version)
                    self._version = listing.resource_version
                    self.relists += 1
                    self.synced.set()
                async for event, raw in self.api.watch_node_pods(self._version, WATCH_TIMEOUT_S):
                    version = (raw.get("metadata") or {}).get("resourceVersion")
                    if version:
                        self._version = str(version)
                    failures = 0
                    if event in ("ADDED", "MODIFIED", "DELETED"):
                        async with self.lock:
                            self._apply_event(event, raw)
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
                    self._version = None
                    continue
                if code == 410:
                    log.info(
                        "node %s: pod watch expired at version %s; listing again",
                        self.node,
                        self._version,
                    )
                    self._version = None
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
        retry_s = self.config.sharing.gpu_share.sync_interval_s
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            try:
                listing = await self.api.list_node_pods()
                async with self.lock:
                    self._take_listing(listing.pods, listing.resource_version)
                self.relists += 1
            except Exception as err:
                log.warning("node %s: cannot list this node's pods: %s", self.node, err)
            await asyncio.sleep(retry_s)

    async def _reconcile_loop(self, interval_s: float) -> None:
        """Reconcile every ``interval_s``, and at once when a pod of this node has left; once
        more a moment later, in case the kubelet had not let go of its devices yet."""
        follow_up = False
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # API or kubelet hiccups: log, try again next round
                log.warning("node %s: %s failed: %s", self.node, "reconcile", err)
            wait_s = min(interval_s, POD_LEFT_FOLLOW_UP_S) if follow_up else interval_s
            try:
                async with asyncio.timeout(wait_s):
                    await self._pod_left.wait()
            except TimeoutError:
                follow_up = False
            else:
                follow_up = True
            self._pod_left.clear()


def _repaired(pod: NodePod, repair: Repair) -> NodePod:
    return pod.with_records(repair.decision or pod.decision, repair.ledger or pod.ledger)


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
