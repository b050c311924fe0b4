"""Ranking DRA nodes for DRA pods: the simulator's node choice on the cluster's DRA card state.

kube-scheduler sends a pod to an extender only when it requests one of the extender's managed
resources, or when the extender manages none; a pod that asks for GPUs through ResourceClaims
requests none of ours. So the scheduler config names the extender a second time, with no
managed resources and only ``prioritizeVerb: prioritize-dra`` (ignorable, no filter, no bind),
and that verb lands here. DRA's allocator still picks the card and does the accounting; this
only says which node the pod is best placed on, so a wrong or stale view costs placement
quality, never correctness.

The pure part, table-tested:

* :func:`card_states`: a node's cards from its slice devices (memory capacity, compute in
  milli-cards) minus what the allocated claims' results consumed (a result without consumed
  capacity takes the whole card), as the engine's :class:`~kubegpu.placement.model.GpuState`.
* :func:`pod_claim_names` and :func:`dra_demand`: the pod's claims (``status.
  resourceClaimStatuses`` names the ones made from templates) and what their requests for our
  DeviceClasses ask, as one :class:`~kubegpu.placement.model.PodRequest`: whole cards, or
  one share (compute milli, memory MiB).

:class:`DraRanker` then scores the candidate nodes that publish a slice with the extender's
own policy and target workload on a :class:`~kubegpu.placement.device_order.DeviceOrderEngine`
of those nodes, which knows each node's device order as its slice lists it: the engine
``kubegpu simulate --card-choice first-fit`` (or ``steered``) places with, so the best-ranked
node is the node the simulator would choose on the same state, the one where the card the
allocator will take costs least (``tests/extender/test_dra_rank.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kubegpu.core.dra import KUBEGPU_NAMING, AllocatedDevice, DraNaming, device_index
from kubegpu.core.dra_cluster import DraClaim, SliceDevice
from kubegpu.extender.dra_view import DraClusterState
from kubegpu.extender.ranking import cpu_pod_priorities, extender_priorities, names_with, ranked
from kubegpu.extender.scheduler import GpuScheduler
from kubegpu.placement.device_order import CardChoice, DeviceOrderEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest
from kubegpu.placement.policies import PolicySpec
from kubegpu.sharing.accounting import node_state
from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.resources import pod_key

log = logging.getLogger(__name__)

_MIB = 2**20


class DemandError(ValueError):
    """The pod's DRA demand cannot be ranked; the message says why."""


def card_states(
    devices: Sequence[SliceDevice], allocated: Iterable[AllocatedDevice]
) -> tuple[GpuState, ...]:
    """The node's cards as the engine sees them, in device index order: free compute milli and
    free memory MiB after ``allocated`` (results of other pools or devices are ignored). A
    tainted device has nothing free (the allocator gives it to no new claim); a device not
    named ``gpu-<index>`` is not ours to rank and is left out."""
    mine = {(d.pool, d.name) for d in devices}
    used: dict[tuple[str, str], list[int]] = {}
    whole: set[tuple[str, str]] = set()
    for result in allocated:
        key = (result.pool, result.device)
        if key not in mine:
            continue
        if result.memory_bytes is None and result.compute_milli is None:
            whole.add(key)  # no consumed capacity: the whole card
            continue
        slot = used.setdefault(key, [0, 0])
        slot[0] += result.compute_milli or 0
        slot[1] += result.memory_bytes or 0
    cards: list[GpuState] = []
    for device in devices:
        index = device_index(device.name)
        if index is None:
            continue
        key = (device.pool, device.name)
        compute_used, memory_used = used.get(key, (0, 0))
        memory_mib = device.memory_bytes // _MIB
        if device.tainted or key in whole or device.compute_milli <= 0:
            cards.append(GpuState(index, 0, 0, device.model, memory_mib))
            continue
        compute_left = max(0, device.compute_milli - compute_used)
        free_milli = min(MILLI_PER_GPU, compute_left * MILLI_PER_GPU // device.compute_milli)
        free_memory = max(0, device.memory_bytes - memory_used) // _MIB
        cards.append(GpuState(index, free_milli, free_memory, device.model, memory_mib))
    return tuple(sorted(cards, key=lambda g: g.index))


@dataclass(frozen=True)
class PodClaims:
    """The claims a pod names: ``names`` of the ResourceClaim objects to read, ``unknown`` the
    pod's claim entries whose generated claim is not named yet."""

    names: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


def _mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is an object; any other type reads as empty (kube-scheduler sends
    every pod here, and one the API server stored is well-formed: this is for the rest)."""
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def pod_claim_names(pod: Mapping[str, Any]) -> PodClaims:
    """``spec.resourceClaims[].resourceClaimName``, or for one made from a template the name
    ``status.resourceClaimStatuses`` gives it. A status entry without a name means no claim
    was needed (Kubernetes' rule), not an unknown one."""
    entries = _list(_mapping(pod.get("spec")).get("resourceClaims"))
    generated: dict[str, str | None] = {}
    for status in _list(_mapping(pod.get("status")).get("resourceClaimStatuses")):
        if isinstance(status, Mapping) and isinstance(status.get("name"), str):
            named = status.get("resourceClaimName")
            generated[status["name"]] = named if isinstance(named, str) and named else None
    names: list[str] = []
    unknown: list[str] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        direct = entry.get("resourceClaimName")
        if isinstance(direct, str) and direct:
            names.append(direct)
            continue
        entry_name = str(entry.get("name", ""))
        if entry_name not in generated:
            unknown.append(entry_name)
        elif generated[entry_name] is not None:
            names.append(str(generated[entry_name]))
    return PodClaims(tuple(names), tuple(unknown))


def dra_demand(
    claims: Sequence[DraClaim],
    cpu_milli: int,
    memory_mib: int,
    name: str = "",
    *,
    unnamed_compute_milli: int = MILLI_PER_GPU,
) -> PodRequest | None:
    """What the pod's not yet allocated claims ask of our driver, as one request: whole cards
    (requests naming no capacity, or the whole compute) or one share. None when they ask for
    nothing of ours; :class:`DemandError` for what one request cannot express (several shares,
    or shares beside whole cards: the engine places one shape per pod).

    A request naming no compute is charged the request policy's default,
    ``unnamed_compute_milli`` (:class:`~kubegpu.core.dra.DraNaming`): under our naming the
    whole card's compute, so it takes a card of its own; under NVIDIA's none, so a request
    naming only memory is a memory share (holding 1 milli of compute in the engine, as a
    memory-only share of the device plugin does) and one naming nothing is a whole card.
    Memory left unnamed is not constrained here (the allocator charges it the default all
    the same)."""
    whole = 0
    shares: list[tuple[int, int | None]] = []
    for claim in claims:
        if claim.allocated:
            continue  # holds its devices already; nothing left to place
        if claim.problem:
            raise DemandError(claim.problem)
        for request in claim.requests:
            compute = (
                unnamed_compute_milli if request.compute_milli is None else request.compute_milli
            )
            if request.whole or compute >= MILLI_PER_GPU:
                whole += request.count
                continue
            memory = (
                None if request.memory_bytes is None else math.ceil(request.memory_bytes / _MIB)
            )
            shares.extend([(compute, memory)] * request.count)
    if not whole and not shares:
        return None
    if shares and (whole or len(shares) > 1):
        raise DemandError(
            f"{len(shares)} share(s) and {whole} whole GPU(s) in one pod: only whole GPUs or a "
            "single share are ranked"
        )
    if whole:
        return PodRequest(cpu_milli, memory_mib, whole, MILLI_PER_GPU, name=name)
    compute, memory = shares[0]
    return PodRequest(cpu_milli, memory_mib, 1, max(1, compute), memory, name=name)


def ranking_engine(
    nodes: Sequence[NodeState],
    policy: PolicySpec,
    workload: TypicalWorkload | None,
    device_orders: Mapping[str, Sequence[int]] | None = None,
) -> DeviceOrderEngine:
    """The engine DRA nodes are ranked on: ``nodes`` in name order, ranked by that order (the
    tie-break), with the extender's policy and target workload, and each node's cards in
    the order its slice lists them (``device_orders``, device indices; index order where
    absent): the allocator takes the first that fits, and the ranking prices that card
    (:meth:`DeviceOrderEngine.best_position
    <kubegpu.placement.device_order.DeviceOrderEngine.best_position>`)."""
    ranked = [replace(n, rank=i) for i, n in enumerate(sorted(nodes, key=lambda n: n.name))]
    return DeviceOrderEngine(
        ranked,
        policy,
        workload if policy.needs_workload else None,
        card_choice=CardChoice.FIRST_FIT,
        published_orders=device_orders,
    )


def slice_order(devices: Sequence[SliceDevice]) -> tuple[int, ...]:
    """The device indices of our cards in the order the node's slices list them (the order
    the allocator walks)."""
    return tuple(i for i in (device_index(d.name) for d in devices) if i is not None)


class DraRanker:
    """``/prioritize-dra``: each candidate node's score for a DRA pod.

    The engine is rebuilt only when the ranked nodes' state or the workload changed (DRA nodes
    are few, and kube-scheduler asks once per pod per scheduling cycle)."""

    def __init__(
        self,
        scheduler: GpuScheduler,
        dra: DraClusterState,
        naming: DraNaming = KUBEGPU_NAMING,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.view = scheduler.view
        self.dra = dra
        self.naming = naming
        self.clock = clock
        self._workload: TypicalWorkload | None = None
        self._workload_at = -math.inf
        self._engine_states: tuple[NodeState, ...] | None = None
        self._engine_orders: dict[str, tuple[int, ...]] | None = None
        self._engine_workload: TypicalWorkload | None = None
        self._engine: DeviceOrderEngine | None = None

    def workload(self) -> TypicalWorkload | None:
        """The extender's target workload, the same definition /prioritize scores against,
        refreshed as often as the scheduler refreshes its own."""
        if not self.scheduler.engine_policy.needs_workload:
            return None
        if self.scheduler.configured_workload is not None:
            return self.scheduler.configured_workload
        now = self.clock()
        if self._workload is None or now - self._workload_at > self.scheduler.workload_refresh_s:
            self._workload = self.scheduler.current_workload()
            self._workload_at = now
        return self._workload

    def node_states(self, node_names: Iterable[str], *, plain: bool = False) -> list[NodeState]:
        """The DRA card state of each of ``node_names`` that publishes our slice and that the
        node watch knows (its CPU and memory come from there, as for /prioritize). With
        ``plain``, the nodes without our slice too, with the cards the node view gives them
        (the device plugin's): the whole cluster as one engine sees it."""
        return self._states_and_orders(node_names, plain=plain)[0]

    def _states_and_orders(
        self, node_names: Iterable[str], *, plain: bool = False
    ) -> tuple[list[NodeState], dict[str, tuple[int, ...]]]:
        """:meth:`node_states`, and each DRA node's :func:`slice_order`, from one read of
        each node's devices (every ranking call reads every candidate node)."""
        states: list[NodeState] = []
        orders: dict[str, tuple[int, ...]] = {}
        for name in dict.fromkeys(node_names):
            devices = self.dra.devices_on(name)
            info = self.view.nodes.get(name)
            if info is None:
                continue
            if not devices:
                if plain:
                    states.append(node_state(info, self.view.usages_on(name)))
                continue
            orders[name] = slice_order(devices)
            pools = {d.pool for d in devices}
            allocated = [a for pool in sorted(pools) for a in self.dra.allocated_in(pool)]
            cards = card_states(devices, allocated)
            models = {g.model for g in cards}
            base = node_state(info, self.view.usages_on(name))
            states.append(
                replace(base, gpu_model=models.pop() if len(models) == 1 else "", gpus=cards)
            )
        return states, orders

    def demand(self, pod: Mapping[str, Any]) -> PodRequest | None:
        """The pod's DRA demand; None when it asks nothing of our driver; raises
        :class:`DemandError` naming why it cannot be read."""
        names = pod_claim_names(pod)
        if not names.names and not names.unknown:
            return None
        if names.unknown:
            raise DemandError(
                f"claim(s) {', '.join(names.unknown)} made from a template are not named in "
                "status.resourceClaimStatuses yet"
            )
        namespace = str(_mapping(pod.get("metadata")).get("namespace") or "default")
        claims: list[DraClaim] = []
        for claim_name in names.names:
            claim = self.dra.claim(namespace, claim_name)
            if claim is None:
                raise DemandError(f"resourceclaim {namespace}/{claim_name} is not known (yet)")
            claims.append(claim)
        request = read_claim(pod, self.view.names).request
        cpu, memory = (request.cpu_milli, request.host_memory_mib) if request else (0, 0)
        unnamed = self.naming.unnamed_compute_milli
        return dra_demand(claims, cpu, memory, pod_key(pod), unnamed_compute_milli=unnamed)

    def rank(self, pod: Mapping[str, Any], node_names: Sequence[str]) -> dict[str, int]:
        """Score 0..10 of every one of ``node_names``: 0 for a pod without our DRA claims,
        one whose claims cannot be read (logged), a node without our slice, or one the pod
        does not fit by our accounting."""
        scores = dict.fromkeys(node_names, 0)
        if not _list(_mapping(pod.get("spec")).get("resourceClaims")):
            return scores  # the common case, answered without looking at anything else
        self.dra.start()
        if not self.dra.synced.is_set() or not self.view.synced.is_set():
            return scores
        try:
            request = self.demand(pod)
        except DemandError as exc:
            log.info("pod %s: DRA nodes not ranked: %s", pod_key(pod), exc)
            return scores
        if request is None:
            return scores
        states, orders = self._states_and_orders(node_names)
        if not states:
            return scores
        engine = self._engine_for(states, orders)
        rows = engine.feasible_rows(request)
        priorities = extender_priorities(*ranked(engine, request, rows))
        for row, priority in zip(rows.tolist(), priorities.tolist(), strict=True):
            scores[engine.names[row]] = priority
        return scores

    def rank_cpu_pod(self, pod: PodRequest, node_names: Sequence[str]) -> dict[str, int] | None:
        """Priorities of a pod asking for no GPU, when some of ``node_names`` publish our slice:
        the policy's ranking (:func:`~kubegpu.extender.ranking.cpu_pod_priorities`) on one
        engine whose DRA nodes carry their cards from the slices and claims, the others theirs
        from the node view. Under DRA the node view sees no cards on a DRA node, so ranking
        there placed CPU-only pods as if those nodes had none: 1,700 of gpushare100's 1,728
        landed off the simulator's nodes on 1,213 KWOK nodes. None while the DRA lists are not
        in or no candidate publishes our slice (the caller ranks on the node view)."""
        self.dra.start()
        if not self.dra.synced.is_set() or not self.view.synced.is_set():
            return None
        states, orders = self._states_and_orders(node_names, plain=True)
        if not orders:  # no candidate publishes our slice (that the node view knows)
            return None
        engine = self._engine_for(states, orders)
        known = set(engine.names)
        rows = np.array(
            [engine.row_of(n) if n in known else -1 for n in node_names], dtype=np.int64
        )
        return names_with(node_names, cpu_pod_priorities(engine, pod, rows))

    def _engine_for(
        self, states: list[NodeState], orders: dict[str, tuple[int, ...]]
    ) -> DeviceOrderEngine:
        workload = self.workload()
        ordered = tuple(sorted(states, key=lambda n: n.name))
        if (
            self._engine is None
            or ordered != self._engine_states
            or orders != self._engine_orders
            or workload is not self._engine_workload
        ):
            self._engine = ranking_engine(ordered, self.scheduler.engine_policy, workload, orders)
            self._engine_states = ordered
            self._engine_orders = orders
            self._engine_workload = workload
        return self._engine
