"""Card-level sharing on the node: Allocate for share slots, whole/shared collision guard,
and reconciliation against the kubelet's PodResources API.

One :class:`SharingCoordinator` per agent (``sharing.gpuShare.enabled``). It answers
``GetPreferredAllocation`` and ``Allocate`` for every resource of the node:

* share slots: the pending pod is resolved as :mod:`kubegpu.kubelet.shares` describes, its
  ledger annotation (``kubegpu.io/gpu-allocated``) is written *before* the answer goes back, and
  the container is told its card and share (plus the MPS limits in ``mps`` mode);
* whole GPUs: steered to the extender's decision when there is one, and refused on a card that
  holds shares.

This node's pods come from :class:`~kubegpu.kubelet.pod_view.NodePodView` (one LIST, then a
watch), which keeps the withdrawn ids current; ``GetPreferredAllocation`` and ``Allocate`` LIST
again, since they must see a pod the kubelet admits the moment its own watch shows it bound.

Whole GPUs and shares never meet on one card, by three layers (docs/sharing.md): the extender's
accounting never decides it; the coordinator withdraws the ids that would allow it (a card
holding shares reports its whole-GPU id Unhealthy, so the kubelet cannot pick it; a card in
whole use keeps its share slots, see ``_update_blocked``); and ``Allocate`` verifies and
refuses. Allocations are serialised by one lock: the kubelet admits pods one at a time anyway,
and the ledger read + write must not interleave.

The pods' records follow what the kubelet really handed out
(:class:`~kubegpu.kubelet.reconcile.RecordKeeper`, against its PodResources API): on a timer,
at once when a pod of this node leaves, and before every share ``Allocate``. The pods'
``kubegpu.io/gpu-allocation`` then says what runs (the extender only writes it before binding,
so the agent is its sole writer afterwards) and the extender's accounting is the truth.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import GpuUuid
from kubegpu.kubelet.board import DeviceBoard
from kubegpu.kubelet.cluster import ConflictError, NodeApi, PodResourcesApi
from kubegpu.kubelet.peer_compat import peer_ask, peers_of
from kubegpu.kubelet.pod_view import NodePodView
from kubegpu.kubelet.reconcile import RecordKeeper, now_rfc3339
from kubegpu.kubelet.resources import (
    AllocateAnswer,
    AllocationError,
    AllocationRefused,
    BindMount,
    ResourcePlan,
    card_of,
)
from kubegpu.kubelet.shares import (
    NodePod,
    describe_pending,
    pending_share_pods,
    preferred_whole_cards,
    share_candidates,
    share_cards,
    whole_decision_cards,
)
from kubegpu.sharing.annotations import CardShare
from kubegpu.sharing.claim import annotation_patch, grant
from kubegpu.sharing.contract import Grant, PeerAsk, share_contract
from kubegpu.sharing.ledger import GrantedContainer
from kubegpu.sharing.resources import ResourceNames

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
POD_LEFT_FOLLOW_UP_S = 2.0  # after a pod left: one more reconcile this much later


def resource_names(config: AgentConfig) -> ResourceNames:
    share = config.sharing.gpu_share
    return ResourceNames(
        whole_gpu=share.whole_resource_name,
        gpu_memory=share.memory_resource_name,
        gpu_compute=share.compute_resource_name,
        share_slot=share.resource_name,
        peers=peers_of(config),
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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.config = config
        self.api = api
        self.board = board
        self.pod_resources = pod_resources
        self.clock = clock
        self.names = resource_names(config)
        self.plans: list[ResourcePlan] = []
        self.lock = asyncio.Lock()
        # Whole cards we handed out since (card -> when): the kubelet's truth catches up later.
        self.recent_whole: dict[str, float] = {}
        self._collisions: set[str] = set()
        # This node's pods, kept current by a watch (run() runs it).
        self.view = NodePodView(
            node,
            api,
            self.names,
            self.lock,
            self._update_blocked,
            sync_interval_s=config.sharing.gpu_share.sync_interval_s,
        )
        # The pods' records against the kubelet's PodResources.
        self.records = RecordKeeper(node, api, self.view, pod_resources, clock)

    @property
    def pods(self) -> list[NodePod]:
        return self.view.pods

    @pods.setter
    def pods(self, pods: list[NodePod]) -> None:
        self.view.pods = pods

    @property
    def drift_count(self) -> int:
        return self.records.drift_count

    @property
    def synced(self) -> asyncio.Event:
        return self.view.synced

    @property
    def relists(self) -> int:
        return self.view.relists

    async def refresh(self) -> None:
        await self.view.refresh()

    def set_plans(self, plans: Sequence[ResourcePlan]) -> None:
        self.plans = list(plans)
        self.records.plans = self.plans
        self._update_blocked()

    # -- the whole/shared guard --------------------------------------------------------------

    def share_cards(self) -> dict[str, list[str]]:
        cards = share_cards(self.pods)
        for uuid in self.records.kubelet_share_cards:
            cards.setdefault(uuid, ["(kubelet PodResources)"])
        return cards

    def whole_cards(self) -> dict[str, str]:
        cards = whole_decision_cards(self.pods)
        for uuid in self.records.kubelet_whole_cards:
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
        # MIG devices are placed by kube-scheduler alone: the extender decides whole cards and
        # shares, never a MIG device, so there is no decision to steer them by.
        return not plan.mig

    async def preferred(
        self, plan: ResourcePlan, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...] | None:
        if must_include:
            return None  # reuse of an init container's ids: the plan's answer keeps them
        async with self.lock:
            await self.view.refresh_or_keep("a preferred allocation")
            holdings = await self.records.holdings("a preferred allocation")
            # What the records will say once PodResources' truth is written back.
            pods = self.records.followed(holdings, set(self.share_cards()))
            if plan.share_slots:
                held = None if holdings is None else self.records.held_pods(holdings, slots=True)
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
                admitted = self.records.held_pods(holdings, slots=False)
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
        await self.view.refresh_or_keep("a whole-GPU allocation")
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
            holdings = await self.records.holdings(f"share slot {slot}")
            if holdings is not None:
                # Records first follow what the kubelet really gave (an earlier Allocate may
                # have served another pod than the one admitted): the share handed out below
                # must come from records that are true.
                repairs = self.records.share_repairs(holdings)
                if repairs:
                    await self.records.apply(repairs)
                    continue
            wholes = self.whole_cards()
            if card in wholes:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: card {card} is in use as a whole GPU by {wholes[card]}; "
                    f"refusing share slot {slot}",
                )
            held = None if holdings is None else self.records.held_pods(holdings, slots=True)
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
                now_rfc3339(self.clock),
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
            card_mib = self.records.cards().get(card, (0, 0))[1]
            return self._answer(
                plan, slot, share, peer_ask(self.config, claim, container, card_mib)
            )
        raise AllocationRefused(
            "ABORTED",
            f"node {self.node}: share slot {slot}: pods kept changing while recording the "
            "allocation; the kubelet will fail this pod's admission",
        )

    def _answer(
        self, plan: ResourcePlan, slot: str, share: CardShare, peer: PeerAsk | None
    ) -> AllocateAnswer:
        """The container's answer: the slot's devices, named by the device-list strategy, and
        the share contract for ``share`` (the decided share, exactly what was just recorded as
        granted; ``peer``: the container asked in a compat mode)."""
        base = plan.allocate(self.config, [slot])
        told = share_contract(Grant.of(share), self.config.sharing.gpu_share, peer=peer)
        # Read-write: MPS clients open the daemon's pipes for writing.
        mps = (BindMount(d, d, read_only=False) for d in told.mounts)
        return replace(base, envs={**base.envs, **told.share_env}, mounts=(*base.mounts, *mps))

    # -- reconciliation ----------------------------------------------------------------------

    async def reconcile(self) -> int:
        """Make the pods' records follow the kubelet's PodResources; returns how many problems
        were found."""
        if self.pod_resources is None:
            return 0
        started = self.clock()
        holdings = await self.pod_resources.list_holdings()
        self.records.note_kubelet_cards(holdings)
        # Allocations older than this listing are in it (or already gone again).
        self.recent_whole = {c: t for c, t in self.recent_whole.items() if t > started}
        async with self.lock:
            if self.view.resume_from is None:
                await self.refresh()  # no watch running (yet): read the pods now
            listed = {(p.namespace, p.name) for p in self.pods if not p.terminal}
            for key in sorted(self.records.held_pods(holdings, slots=True)):
                if key not in listed:
                    log.warning(
                        "node %s: the kubelet reports shares for pod %s/%s, which the API "
                        "server does not list on this node",
                        self.node,
                        *key,
                    )
            found = await self.records.apply(
                self.records.repairs(holdings, set(self.share_cards()))
            )
            self._update_blocked()
        return found

    # -- loops ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the withdrawn ids and the ledgers current until cancelled."""
        share = self.config.sharing.gpu_share
        async with asyncio.TaskGroup() as group:
            group.create_task(self.view.watch())
            if self.pod_resources is not None:
                group.create_task(self._reconcile_loop(share.reconcile_interval_s))

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
                    await self.view.pod_left.wait()
            except TimeoutError:
                follow_up = False
            else:
                follow_up = True
            self.view.pod_left.clear()
