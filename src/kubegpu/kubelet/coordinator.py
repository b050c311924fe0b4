"""Card-level sharing on the node: Allocate for share slots, whole/shared collision guard,
and reconciliation against the kubelet's PodResources API.

One :class:`SharingCoordinator` per agent (``sharing.gpuShare.enabled``). It answers
``GetPreferredAllocation`` and ``Allocate`` for every resource of the node:

* share slots: the pending pod is resolved as :mod:`kubegpu.kubelet.shares` describes, its
  ledger annotation (``kubegpu.io/gpu-allocated``) is written *before* the answer goes back, and
  the container is told its card and share (plus the MPS limits in ``mps`` mode);
* whole GPUs: steered to the extender's decision when there is one, and refused on a card that
  holds shares.

Whole GPUs and shares never meet on one card, by three layers (docs/sharing.md): the extender's
accounting never decides it; the coordinator withdraws the ids that would allow it (a card
holding shares reports its whole-GPU id Unhealthy, a card in whole use reports its slots
Unhealthy), so the kubelet cannot pick them; and ``Allocate`` verifies and refuses. Allocations
are serialised by one lock: the kubelet admits pods one at a time anyway, and the ledger read +
write must not interleave.

Reconciliation lists the kubelet's PodResources (which knows pod ↔ slot) and repairs what
differs: a container missing from a ledger is recorded, a wrong card is corrected, and when
a shared pod really runs on another card than decided, its decision annotation is moved to
that card (the extender only writes it before binding, so the agent is its sole writer
afterwards) so that the extender's accounting is the truth. Every repair is logged with node,
pod and card and noted in the pod's ``kubegpu.io/gpu-drift`` annotation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from kubegpu.config.model import AgentConfig
from kubegpu.core.gpu import GpuUuid
from kubegpu.kubelet.cluster import ConflictError, DeviceHolding, NodeApi, PodResourcesApi
from kubegpu.kubelet.plugin import HealthBoard
from kubegpu.kubelet.resources import (
    AllocationError,
    AllocationRefused,
    BindMount,
    ContainerAllocation,
    ResourcePlan,
    card_of,
)
from kubegpu.kubelet.shares import (
    ALLOCATED_ANNOTATION,
    DRIFT_ANNOTATION,
    GrantedContainer,
    Ledger,
    MpsPaths,
    NodePod,
    describe_pending,
    encode_ledger,
    pending_share_pods,
    preferred_whole_cards,
    read_node_pod,
    share_cards,
    share_env,
    whole_decision_cards,
)
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    encode_allocation,
)
from kubegpu.sharing.resources import ResourceNames

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


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
        board: HealthBoard,
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
        self._problems: dict[str, str] = {}
        self._collisions: set[str] = set()

    def set_plans(self, plans: Sequence[ResourcePlan]) -> None:
        self.plans = list(plans)
        self._update_blocked()

    # -- reading ---------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Re-read this node's pods from the API server (raises on API errors)."""
        raw = await self.api.list_node_pods()
        pods = [read_node_pod(p, self.node, self.names) for p in raw]
        for pod in pods:
            if pod.problem and self._problems.get(pod.uid) != pod.problem:
                self._problems[pod.uid] = pod.problem
                log.warning("node %s: %s", self.node, pod.problem)
        self.pods = pods
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
                "node %s: card %s is both shared (%s) and whole (%s); both withdrawn",
                self.node,
                uuid,
                ", ".join(shares[uuid]),
                wholes[uuid],
            )
        for plan in self.plans:
            cards = {g.uuid for g in plan.gpus}
            taken = wholes if plan.share_slots else shares
            blocked = frozenset(GpuUuid(u) for u in taken if u in cards)
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
            if plan.share_slots:
                for pod in pending_share_pods(self.pods):
                    ids = sorted(
                        (i for i in available if card_of(i) == pod.shared_card),
                        key=lambda i: plan.lookup(i).replica or 0,
                    )
                    if len(ids) >= size:
                        log.info(
                            "node %s: steering %s to card %s for pod %s",
                            self.node,
                            plan.resource_name,
                            pod.shared_card,
                            pod.key,
                        )
                        return tuple(ids[:size])
                return None
            by_card = {str(card_of(i)): i for i in available if plan.lookup(i).replica is None}
            cards = preferred_whole_cards(self.pods, set(by_card), size)
            if cards is not None:
                return tuple(by_card[c] for c in cards)
            # No decision (placed by another scheduler): the extender assumes such a pod holds
            # the highest-index free cards, so make that true rather than guess topology.
            if len(by_card) < size:
                return None
            ordered = sorted(by_card.values(), key=lambda i: -plan.lookup(i).gpu.index)
            return tuple(ordered[:size])

    async def allocate(self, plan: ResourcePlan, device_ids: Sequence[str]) -> ContainerAllocation:
        for device_id in device_ids:
            plan.lookup(device_id)  # unknown ids: INVALID_ARGUMENT, as without sharing
        async with self.lock:
            if plan.share_slots:
                return await self._allocate_share(plan, device_ids)
            return await self._allocate_whole(plan, device_ids)

    async def _allocate_whole(
        self, plan: ResourcePlan, device_ids: Sequence[str]
    ) -> ContainerAllocation:
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
    ) -> ContainerAllocation:
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
            wholes = self.whole_cards()
            if card in wholes:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: card {card} is in use as a whole GPU by {wholes[card]}; "
                    f"refusing share slot {slot}",
                )
            candidates = pending_share_pods(self.pods, card)
            if not candidates:
                raise AllocationRefused(
                    "FAILED_PRECONDITION",
                    f"node {self.node}: share slot {slot}: no pending pod has a kubegpu decision "
                    f"(kubegpu.io/gpu-allocation) for card {card} with a container still to "
                    f"allocate ({describe_pending(pending_share_pods(self.pods))}); is the pod "
                    "scheduled through the kubegpu scheduler extender?",
                )
            pod = candidates[0]
            step = pod.next_container()
            assert step is not None
            container, share = step
            granted = GrantedContainer(
                container,
                card,
                slot,
                share.compute_milli,
                share.memory_mib,
                _now_rfc3339(self.clock),
            )
            ledger = (pod.ledger or Ledger(self.node)).with_container(granted)
            try:
                await self.api.patch_pod_annotations(
                    pod.namespace,
                    pod.name,
                    {ALLOCATED_ANNOTATION: encode_ledger(ledger)},
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
            self.pods = [replace(p, ledger=ledger) if p.uid == pod.uid else p for p in self.pods]
            self._update_blocked()
            log.info(
                "node %s: pod %s container %s gets card %s (share slot %s, %d MiB, %d milli)",
                self.node,
                pod.key,
                container,
                card,
                slot,
                share.memory_mib,
                share.compute_milli,
            )
            return self._answer(plan, slot, card, share.memory_mib, share.compute_milli)
        raise AllocationRefused(
            "ABORTED",
            f"node {self.node}: share slot {slot}: pods kept changing while recording the "
            "allocation; the kubelet will fail this pod's admission",
        )

    def _answer(
        self, plan: ResourcePlan, slot: str, card: str, memory_mib: int, compute_milli: int
    ) -> ContainerAllocation:
        base = plan.allocate(self.config, [slot])
        share = CardShare(card, plan.lookup(slot).gpu.index, compute_milli, memory_mib)
        enforcement = self.config.sharing.gpu_share.enforcement
        envs = {**base.envs, **share_env(card, share, enforcement, self.mps)}
        mounts = list(base.mounts)
        if enforcement == "mps" and self.mps is not None:
            # Read-write: MPS clients open the daemon's pipes for writing.
            mounts.append(BindMount(self.mps.pipe_dir, self.mps.pipe_dir, read_only=False))
            mounts.append(BindMount(self.mps.log_dir, self.mps.log_dir, read_only=False))
        return replace(base, envs=envs, mounts=tuple(mounts))

    # -- reconciliation ----------------------------------------------------------------------

    async def reconcile(self) -> int:
        """Cross-check the ledgers with the kubelet; returns how many problems were found."""
        if self.pod_resources is None:
            return 0
        started = self.clock()
        holdings = await self.pod_resources.list_holdings()
        slot_resources = {p.resource_name for p in self.plans if p.share_slots}
        whole_resources = {p.resource_name for p in self.plans if not p.share_slots}
        self.kubelet_share_cards = {
            card_of(i) for h in holdings if h.resource in slot_resources for i in h.device_ids
        }
        self.kubelet_whole_cards = {
            card_of(i) for h in holdings if h.resource in whole_resources for i in h.device_ids
        }
        # Allocations older than this listing are in it (or already gone again).
        self.recent_whole = {c: t for c, t in self.recent_whole.items() if t > started}
        async with self.lock:
            await self.refresh()
            found = 0
            by_key = {(p.namespace, p.name): p for p in self.pods if not p.terminal}
            grouped: dict[tuple[str, str], list[DeviceHolding]] = {}
            for h in holdings:
                if h.resource in slot_resources and h.device_ids:
                    grouped.setdefault((h.namespace, h.pod), []).append(h)
            for key, pod_holdings in sorted(grouped.items()):
                pod = by_key.get(key)
                if pod is None:
                    log.warning(
                        "node %s: the kubelet reports shares for pod %s/%s, which the API "
                        "server does not list on this node",
                        self.node,
                        *key,
                    )
                    continue
                found += await self._reconcile_pod(pod, pod_holdings)
            self._update_blocked()
        return found

    async def _reconcile_pod(self, pod: NodePod, holdings: list[DeviceHolding]) -> int:
        ledger = pod.ledger or Ledger(self.node)
        problems: list[str] = []
        changed = False
        decided = dict(pod.slot_containers)
        for h in holdings:
            slot = sorted(h.device_ids)[0]
            card = card_of(slot)
            granted = ledger.get(h.container)
            if granted is None:
                share = decided.get(h.container)
                granted = GrantedContainer(
                    h.container,
                    card,
                    slot,
                    share.compute_milli if share else 0,
                    share.memory_mib if share else 0,
                    _now_rfc3339(self.clock),
                    verified=True,
                    source="podresources",
                )
                problems.append(
                    f"container {h.container}: the kubelet gave it share slot {slot} on card "
                    f"{card} but the agent had no record of it; recorded"
                )
            elif granted.uuid != card or granted.slot != slot:
                problems.append(
                    f"container {h.container}: the agent recorded card {granted.uuid} (slot "
                    f"{granted.slot}), the kubelet gave card {card} (slot {slot}); repaired"
                )
                granted = replace(granted, uuid=card, slot=slot, verified=True)
            elif not granted.verified:
                granted = replace(granted, verified=True)
            else:
                continue
            changed = True
            ledger = ledger.with_container(granted)
        if not changed:
            return 0
        patch: dict[str, str | None] = {ALLOCATED_ANNOTATION: encode_ledger(ledger)}
        moved = self._moved_decision(pod, ledger)
        if moved is not None:
            assert pod.shared_card is not None
            problems.append(
                f"the kubelet runs it on card {moved.cards[0].uuid}, the extender had decided "
                f"card {pod.shared_card}; decision moved so the extender accounts the truth"
            )
            patch[ALLOCATION_ANNOTATION] = encode_allocation(moved)
        if problems:
            patch[DRIFT_ANNOTATION] = f"{_now_rfc3339(self.clock)} " + "; ".join(problems)
        for problem in problems:
            log.warning("node %s: pod %s: %s", self.node, pod.key, problem)
        self.drift_count += len(problems)
        try:
            await self.api.patch_pod_annotations(
                pod.namespace, pod.name, patch, pod.resource_version
            )
        except ConflictError:
            log.info("node %s: pod %s changed during reconcile; next round", self.node, pod.key)
            return len(problems)
        self.pods = [replace(p, ledger=ledger) if p.uid == pod.uid else p for p in self.pods]
        if not problems:
            log.info("node %s: pod %s: PodResources confirms its cards", self.node, pod.key)
        return len(problems)

    def _moved_decision(self, pod: NodePod, ledger: Ledger) -> AllocationDecision | None:
        """The pod's shared decision moved to the one card all its containers really run on,
        or None when it already names it (or they are split over cards, which a shared
        decision cannot express: the drift note then stands alone)."""
        decision = pod.decision
        if decision is None or not decision.shared or not ledger.containers:
            return None
        cards = {c.uuid for c in ledger.containers}
        if len(cards) != 1 or cards == {pod.shared_card}:
            return None
        (uuid,) = cards
        index = next((g.index for p in self.plans for g in p.gpus if g.uuid == uuid), None)
        if index is None:
            return None

        def move(share: CardShare) -> CardShare:
            return replace(share, uuid=uuid, index=index)

        return replace(
            decision,
            cards=tuple(move(c) for c in decision.cards),
            containers=tuple(
                replace(c, cards=tuple(move(x) for x in c.cards)) for c in decision.containers
            ),
        )

    # -- loops ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the withdrawn ids and the ledgers current until cancelled."""
        share = self.config.sharing.gpu_share
        async with asyncio.TaskGroup() as group:
            group.create_task(self._every(share.sync_interval_s, self._sync, "pod sync"))
            if self.pod_resources is not None:
                group.create_task(
                    self._every(share.reconcile_interval_s, self.reconcile, "reconcile")
                )

    async def _sync(self) -> None:
        async with self.lock:
            await self.refresh()

    async def _every(
        self, interval_s: float, step: Callable[[], Awaitable[object]], what: str
    ) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # API or kubelet hiccups: log, try again next round
                log.warning("node %s: %s failed: %s", self.node, what, err)
            await asyncio.sleep(interval_s)
