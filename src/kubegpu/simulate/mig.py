"""Replaying a cluster whose cards are in MIG mode: pods ask for a MIG profile, not a fraction.

The trace variant (:func:`mig_variant`) re-expresses each pod of an openb-style trace as MIG
would serve it: a share of ``m`` milli-cards asks for the smallest profile with at least that
compute (``g`` of 7 slices, ``g / 7 >= m / 1000``: 1g, 2g, 3g, 4g or 7g), a whole GPU for the
7g instance (the whole card), a pod of several GPUs for that many 7g instances; CPU-only pods
keep taking CPU and memory. Every card is a MIG card of one profile table (H100 80GB by
default) partitioned on demand, as under dynamic MIG: an instance may start only where the
table allows and never overlaps another (:func:`kubegpu.core.mig.layout_problem`).

Two ways to choose where an instance goes:

* ``first-fit``: the first node (in trace order) with the CPU and memory, its first card with a
  free placement, that card's first free placement: what DRA's allocator does over a slice
  listing placements in table order, and NVIDIA's driver's ``nvidia-smi mig -cgi`` default.
* ``pack``: among every feasible (node, card, placement), the one that leaves its card able to
  take the most further instances (the count of placements of every profile still possible
  there), on the busiest card (most slices in use) of the busiest node first. No constant is
  tuned: the score is a count and the order a tie-break.

Results are the fraction of the cluster's compute slices allocated and the pods placed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubegpu.core.mig import COMPUTE_SLICES, Instance, MigProfile, free_placements, profiles_of
from kubegpu.placement.model import NodeState, PodRequest

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
PROFILE_SLICES = (1, 2, 3, 4, 7)
MIG_POLICIES = ("first-fit", "pack")


@dataclass(frozen=True)
class MigPod:
    """One pod of the MIG variant: ``instances`` GPU instances of ``slices`` compute slices."""

    name: str
    cpu_milli: int
    memory_mib: int
    slices: int = 0  # 0: a CPU-only pod
    instances: int = 0
    milli: int = 0  # the original pod's GPU demand (GPU count × milli per card)


def slices_for(milli: int) -> int:
    """The compute slices of the smallest profile that gives at least ``milli`` of a card."""
    for slices in PROFILE_SLICES:
        if slices * 1000 >= milli * COMPUTE_SLICES:
            return slices
    return COMPUTE_SLICES


def mig_variant(requests: Sequence[PodRequest]) -> list[MigPod]:
    """The pods (in arrival order) as MIG requests."""
    variant = []
    for r in requests:
        demand = r.gpu_count * r.gpu_milli
        if r.gpu_count == 0:
            variant.append(MigPod(r.name, r.cpu_milli, r.memory_mib))
        elif r.gpu_count == 1 and r.gpu_milli < 1000:
            slices = slices_for(r.gpu_milli)
            variant.append(MigPod(r.name, r.cpu_milli, r.memory_mib, slices, 1, demand))
        else:
            variant.append(
                MigPod(r.name, r.cpu_milli, r.memory_mib, COMPUTE_SLICES, r.gpu_count, demand)
            )
    return variant


@dataclass
class _Node:
    name: str
    cpu_free: int
    memory_free: int
    cards: list[list[Instance]] = field(default_factory=list)

    def used_slices(self) -> int:
        return sum(i.profile.compute_slices for card in self.cards for i in card)


@dataclass(frozen=True)
class MigResult:
    policy: str
    placed: int
    refused: int
    first_refusal: int | None  # the index of the first GPU pod refused, in arrival order
    slices_allocated: int
    slices_total: int
    # Each node's cards as they ended, the instances on each.
    layouts: tuple[tuple[tuple[Instance, ...], ...], ...] = ()
    # After each pod: the original GPU demand arrived so far and the compute slices held (the
    # x and y of the allocation curve, as a policy's replay records them).
    arrived_milli: tuple[int, ...] = ()
    used_slices: tuple[int, ...] = ()

    @property
    def allocation_ratio(self) -> float:
        return self.slices_allocated / self.slices_total if self.slices_total else 0.0


def _profile_table(model: str) -> dict[int, MigProfile]:
    """The profile of each slice count a pod may ask for (the plain ones: no ``+me``, and the
    one-slice profile with one memory slice)."""
    table: dict[int, MigProfile] = {}
    for profile in profiles_of(model):
        if "+" in profile.name or profile.compute_slices in table:
            continue
        table[profile.compute_slices] = profile
    return table


@functools.lru_cache(maxsize=65536)
def _free(card: tuple[Instance, ...], profile: MigProfile) -> tuple[Instance, ...]:
    # A card holds one of a few hundred layouts: each is worked out once per profile.
    return tuple(free_placements([profile], card))


def _room(card: tuple[Instance, ...], table: dict[int, MigProfile]) -> int:
    return sum(len(_free(card, p)) for p in table.values())


def _key(card: list[Instance]) -> tuple[Instance, ...]:
    return tuple(sorted(card, key=lambda i: (i.start, i.profile.profile_id)))


def _choose(
    nodes: list[_Node], pod: MigPod, profile: MigProfile, policy: str, table: dict[int, MigProfile]
) -> tuple[_Node, list[tuple[int, Instance]]] | None:
    """Where ``pod``'s instances go: a node and (card, instance) per instance; None if nowhere."""
    ordered = nodes if policy == "first-fit" else sorted(nodes, key=lambda n: -n.used_slices())
    for node in ordered:
        if node.cpu_free < pod.cpu_milli or node.memory_free < pod.memory_mib:
            continue
        cards = [list(card) for card in node.cards]
        chosen: list[tuple[int, Instance]] = []
        for _ in range(pod.instances):
            pick = _pick(cards, profile, policy, table)
            if pick is None:
                break
            cards[pick[0]].append(pick[1])
            chosen.append(pick)
        if len(chosen) == pod.instances:
            return node, chosen
    return None


def _pick(
    cards: list[list[Instance]], profile: MigProfile, policy: str, table: dict[int, MigProfile]
) -> tuple[int, Instance] | None:
    best: tuple[tuple[int, int, int], int, Instance] | None = None
    for index, card in enumerate(cards):
        options = _free(_key(card), profile)
        if not options:
            continue
        if policy == "first-fit":
            return index, options[0]
        used = sum(i.profile.compute_slices for i in card)
        for option in options:
            key = (-_room(_key([*card, option]), table), -used, index)
            if best is None or key < best[0]:
                best = (key, index, option)
    return None if best is None else (best[1], best[2])


def replay_mig(
    nodes: Sequence[NodeState], pods: Sequence[MigPod], policy: str, model: str = DEFAULT_MODEL
) -> MigResult:
    """Place ``pods`` in order on ``nodes`` (every card a ``model`` MIG card, empty at start)."""
    if policy not in MIG_POLICIES:
        raise ValueError(
            f"unknown MIG policy {policy!r} (expected one of {', '.join(MIG_POLICIES)})"
        )
    table = _profile_table(model)
    cluster = [
        _Node(n.name, n.cpu_free_milli, n.memory_free_mib, [[] for _ in n.gpus]) for n in nodes
    ]
    placed = refused = allocated = arrived = 0
    first_refusal: int | None = None
    arrived_curve: list[int] = []
    used_curve: list[int] = []
    for position, pod in enumerate(pods):
        arrived += pod.milli
        if pod.instances == 0:
            node = next(
                (
                    n
                    for n in cluster
                    if n.cpu_free >= pod.cpu_milli and n.memory_free >= pod.memory_mib
                ),
                None,
            )
            if node is not None:
                node.cpu_free -= pod.cpu_milli
                node.memory_free -= pod.memory_mib
        else:
            choice = _choose(cluster, pod, table[pod.slices], policy, table)
            if choice is None:
                refused += 1
                first_refusal = position if first_refusal is None else first_refusal
            else:
                node, instances = choice
                node.cpu_free -= pod.cpu_milli
                node.memory_free -= pod.memory_mib
                for card, instance in instances:
                    node.cards[card].append(instance)
                    allocated += instance.profile.compute_slices
                placed += 1
        arrived_curve.append(arrived)
        used_curve.append(allocated)
    total = sum(len(n.cards) for n in cluster) * COMPUTE_SLICES
    layouts = tuple(tuple(tuple(card) for card in n.cards) for n in cluster)
    return MigResult(
        policy,
        placed,
        refused,
        first_refusal,
        allocated,
        total,
        layouts,
        tuple(arrived_curve),
        tuple(used_curve),
    )
