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
from kubegpu.kubelet.records import Holdings, Repair, follow_share_holdings, follow_whole_holdings
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
    MISMATCH_ANNOTATION,
    GrantedContainer,
    Ledger,
    MpsPaths,
    NodePod,
    describe_pending,
    encode_ledger,
    pending_share_pods,
    preferred_whole_cards,
    read_node_pod,
    share_candidates,
    share_cards,
    share_env,
    whole_decision_cards,
)
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
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
        self.mismatch_count = 0
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
            candidates = share_candidates(self.pods, card, held)
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
                    f"card {share.uuid} ({share.memory_mib} MiB, {share.compute_milli} milli); "
                    f"refusing rather than over-committing card {card} (no free share slot "
                    f"left on card {share.uuid}? raise sharing.gpuShare.slotsPerCard)",
                )
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
                "node %s: pod %s container %s gets card %s (share slot %s, %d MiB, %d milli%s)",
                self.node,
                pod.key,
                container,
                card,
                slot,
                share.memory_mib,
                share.compute_milli,
                ", PodResources shows the kubelet admitting it" if chosen.admitting else "",
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
            await self.refresh()
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
            patch: dict[str, str | None] = {}
            if repair.ledger is not None:
                patch[ALLOCATED_ANNOTATION] = encode_ledger(repair.ledger)
            if repair.decision is not None:
                patch[ALLOCATION_ANNOTATION] = encode_allocation(repair.decision)
            if repair.notes:
                patch[DRIFT_ANNOTATION] = f"{now} " + "; ".join(repair.notes)
            if repair.mismatches:
                patch[MISMATCH_ANNOTATION] = f"{now} " + "; ".join(repair.mismatches)
            try:
                await self.api.patch_pod_annotations(
                    pod.namespace, pod.name, patch, pod.resource_version
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


def _repaired(pod: NodePod, repair: Repair) -> NodePod:
    return pod.with_records(repair.decision or pod.decision, repair.ledger or pod.ledger)
