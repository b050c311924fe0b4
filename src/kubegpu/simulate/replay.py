"""One trace replay: arrivals through the placement engine, and the paper's discretised curve.

The paper's runs never delete pods and never retry a failed one; after every pod (placed or
not) they record the GPU demand arrived so far and the GPU milli allocated. The curve is the
allocation ratio averaged per whole percent of arrived demand (spec §7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from kubegpu.placement.device_order import CardChoice, DeviceOrderEngine
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import ClassKey, TypicalWorkload, class_key
from kubegpu.placement.model import MILLI_PER_GPU, NodeState, PodRequest
from kubegpu.placement.policies import POLICIES, PolicySpec
from kubegpu.placement.target import node_card_memories, reference_card_memory
from kubegpu.placement.target import target_workload as workload_for
from kubegpu.placement.waste import WasteWeights
from kubegpu.simulate.arrivals import Arrivals
from kubegpu.simulate.traces import TracePod

COLUMNS = tuple(range(131))  # arrived workload 0 … 130 % of cluster GPU capacity


@dataclass(frozen=True)
class ReplayResult:
    arrived_milli: npt.NDArray[np.int64]  # after each pod event, failed pods included
    used_milli: npt.NDArray[np.int64]  # allocated milli-GPU after each pod event
    total_gpus: int
    failed_pods: int


def ranked_engine(
    nodes: Sequence[NodeState],
    arrivals: Arrivals,
    policy: PolicySpec,
    workload: TypicalWorkload,
    seed: int,
    waste_weights: WasteWeights | None = None,
    card_choice: CardChoice = CardChoice.POLICY,
    allocator_aware: bool = True,
) -> PlacementEngine:
    """An engine over ``nodes`` with the tie-break ranks of this arrival sequence; a
    ``card_choice`` other than the policy's picks cards as DRA's allocator would, and its
    node choice prices that card unless ``allocator_aware`` is off (benchmarks only: the
    ranking before issue 27)."""
    ranked = [replace(n, rank=arrivals.node_ranks[n.name]) for n in nodes]
    if card_choice is not CardChoice.POLICY:
        return DeviceOrderEngine(
            ranked,
            policy,
            workload,
            seed,
            waste_weights,
            card_choice=card_choice,
            allocator_aware=allocator_aware,
        )
    return PlacementEngine(ranked, policy, workload, seed=seed, waste_weights=waste_weights)


def replay(
    nodes: Sequence[NodeState],
    arrivals: Arrivals,
    policy: PolicySpec,
    workload: TypicalWorkload,
    seed: int,
    waste_weights: WasteWeights | None = None,
    card_choice: CardChoice = CardChoice.POLICY,
    allocator_aware: bool = True,
) -> ReplayResult:
    """Place every arriving pod with ``policy``; record the two counters after each.
    ``waste_weights`` vary our policy's constants (benchmarks only); ``card_choice`` picks
    the card as DRA's allocator would (see ``placement.device_order``; ``allocator_aware``
    as :func:`ranked_engine`).

    A pod's demand is its cards' milli; a share's, where the cards' memory is known (the
    memory-only variants, :mod:`kubegpu.simulate.memory_only`), its level on the cluster's
    most common card (:meth:`~kubegpu.placement.model.PodRequest.card_milli`), so a share
    asking only memory counts what it holds."""
    engine = ranked_engine(
        nodes, arrivals, policy, workload, seed, waste_weights, card_choice, allocator_aware
    )
    count = len(arrivals.pods)
    arrived = np.zeros(count, dtype=np.int64)
    used = np.zeros(count, dtype=np.int64)
    arrived_total = used_total = failed = 0
    place = engine.place
    card_memory = reference_card_memory(node_card_memories(nodes))
    for e, pod in enumerate(arrivals.pods):
        demand = pod.gpu_count * pod.card_milli(card_memory)
        arrived_total += demand
        if place(pod) is None:
            failed += 1
        else:
            used_total += demand
        arrived[e] = arrived_total
        used[e] = used_total
    total_gpus = int(sum(len(n.gpus) for n in nodes))
    return ReplayResult(arrived, used, total_gpus, failed)


def discretise(result: ReplayResult) -> list[float | None]:
    """Columns 0…130 exactly as the paper's ``merge_alloc_discrete.py`` computes them.

    Per event: arrived % rounded half-even to an integer, allocation % rounded to 2 decimals
    (Python's correctly rounded ``round``); per column: the mean of the events with exactly
    that arrived %, else of those within ±1, rounded with numpy's ``round`` (the mean is a
    numpy float there). Pairwise summation (``np.sum``) matches pandas' ``mean``.
    """
    total = result.total_gpus
    arrive = np.rint(result.arrived_milli / total / 10).astype(np.int64)
    alloc = np.array([round(v, 2) for v in (result.used_milli / total / 10).tolist()])
    columns: list[float | None] = []
    for x in COLUMNS:
        values = alloc[arrive == x]
        if values.size == 0:
            values = alloc[(arrive >= x - 1) & (arrive <= x + 1)]
        if values.size == 0:
            columns.append(None)
            continue
        mean = np.sum(values) / values.size
        columns.append(float(np.round(mean, 2)))
    return columns


def typical_workload(pods: Sequence[PodRequest | TracePod]) -> TypicalWorkload:
    """FGD's target workload: the original trace's most popular pod classes (spec §6), a
    trace pod's models keyed by its ``gpu_spec`` as written (a bare request: by its set)."""
    return target_workload(POLICIES["fgd"], pods)


def class_keys(
    pods: Sequence[PodRequest | TracePod], card_memory_mib: int | None = None
) -> list[ClassKey]:
    """One class key per pod, a trace pod's models spelt as in the trace; shares at their
    level on a card of ``card_memory_mib`` (None: memory not known, by compute)."""
    return [
        class_key(p.request, p.gpu_spec, card_memory_mib)
        if isinstance(p, TracePod)
        else class_key(p, card_memory_mib=card_memory_mib)
        for p in pods
    ]


def target_workload(
    policy: PolicySpec,
    pods: Sequence[PodRequest | TracePod],
    nodes: Sequence[NodeState] = (),
) -> TypicalWorkload:
    """The workload ``policy`` measures fragmentation against: every pod of the original
    trace (CPU-only ones too), by the one definition the extender uses as well
    (:func:`kubegpu.placement.target.target_workload`): shares at their level on the most
    common card of ``nodes`` where their memory is known."""
    card_memory = reference_card_memory(node_card_memories(nodes))
    return workload_for(policy, class_keys(pods, card_memory))


def capacity_milli(nodes: Sequence[NodeState]) -> int:
    return sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU
