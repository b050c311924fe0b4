"""Which GPUs of one node belong together: the topology-aware preferred allocation.

The kubelet asks the device plugin (``GetPreferredAllocation``) which ``size`` devices, out of
the free ones and including some it already picked, it should hand to a container. This module
answers from the node inventory alone, without I/O, so the device plugin's handler stays thin
and tests can check the answer against a brute force. (The extender and the simulator choose
cards with :mod:`kubegpu.placement.engine` instead: they place shares and whole cards by
policy, not by links.)

Two cases, as in NVIDIA's plugin:

* whole GPUs: maximise the sum over all chosen pairs of :func:`pair_score`; exact (branch and
  bound over combinations in index order), so provably optimal at any size, and the bound keeps
  16-GPU nodes fast;
* time-slicing replicas: the replica ids of one GPU are interchangeable, so the question is only
  how many to take from which GPU: ``packed`` fills the busiest GPU first, ``distributed`` the
  least used one first.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from kubegpu.core.gpu import GpuLink, GpuUuid, NodeInventory

# One NVLink lane is worth more than the best PCIe path plus the NUMA bonus, so any NVLink
# connection beats any PCIe-only one, and more lanes beat fewer.
NVLINK_LANE_SCORE = 100
# Same NUMA node (both known): a small bonus that only breaks ties between equal PCIe levels.
SAME_NUMA_SCORE = 5


class ReplicaPolicy(enum.Enum):
    """How to spread time-slicing replicas over physical GPUs (NVIDIA's names)."""

    PACKED = "packed"  # fill the GPU that already has the most replicas in use
    DISTRIBUTED = "distributed"  # prefer the GPU with the fewest replicas in use


class PreferenceError(ValueError):
    """The request cannot be answered (unknown ids, too few devices, bad size)."""


def pair_score(link: GpuLink | None, numa_a: int | None, numa_b: int | None) -> int:
    """How well two GPUs talk to each other; higher is better, 0 when nothing is known."""
    score = 0
    if link is not None:
        score += link.nvlinks * NVLINK_LANE_SCORE + int(link.pcie)
    if numa_a is not None and numa_a == numa_b:
        score += SAME_NUMA_SCORE
    return score


@dataclass(frozen=True)
class Choice:
    """The chosen GPUs (inventory order) and their total pairwise score."""

    uuids: tuple[GpuUuid, ...]
    score: int


def score_matrix(inventory: NodeInventory) -> tuple[tuple[int, ...], ...]:
    """Pairwise scores by position in ``inventory.gpus`` (diagonal 0)."""
    gpus = inventory.gpus
    rows = []
    for a in gpus:
        rows.append(
            tuple(
                0
                if a.uuid == b.uuid
                else pair_score(inventory.link(a.uuid, b.uuid), a.numa_node, b.numa_node)
                for b in gpus
            )
        )
    return tuple(rows)


def best_gpu_set(
    inventory: NodeInventory,
    available: Iterable[GpuUuid],
    must_include: Iterable[GpuUuid],
    size: int,
) -> Choice:
    """The ``size`` GPUs out of ``available`` (must-include ones counted) with the best score.

    Ties go to the set whose positions in the inventory, sorted, are lexicographically
    smallest — i.e. the lowest indices — because the search visits candidates in ascending
    position and only replaces the incumbent on a strictly better score, so the first optimum
    found wins. That keeps answers stable across calls and across processes.
    """
    position = {gpu.uuid: i for i, gpu in enumerate(inventory.gpus)}
    avail = set(available)
    must = set(must_include)
    unknown = sorted((avail | must) - position.keys())
    if unknown:
        raise PreferenceError(f"unknown GPU {unknown[0]}")
    avail |= must
    if size < len(must):
        raise PreferenceError(f"size {size} is smaller than the {len(must)} must-include GPUs")
    if size > len(avail):
        raise PreferenceError(f"size {size} exceeds the {len(avail)} available GPUs")

    matrix = score_matrix(inventory)
    fixed = sorted(position[u] for u in must)
    free = sorted(position[u] for u in avail - must)
    picked, score = _branch_and_bound(matrix, fixed, free, size - len(fixed))
    chosen = sorted([*fixed, *picked])
    return Choice(tuple(inventory.gpus[i].uuid for i in chosen), score)


def _branch_and_bound(
    matrix: Sequence[Sequence[int]], fixed: list[int], free: list[int], need: int
) -> tuple[list[int], int]:
    """Exact maximum of the pairwise sum over ``fixed`` + ``need`` of ``free``.

    Bound for ``r`` more picks from the candidates after the current one: each candidate ``c``
    adds ``gain(c)`` = its score to the already chosen set plus half its pair scores to the
    other new picks, and half of a pair's score is at most half of ``c``'s ``r - 1`` best
    scores to any other free GPU. So the sum of the ``r`` largest optimistic gains bounds any
    completion. Scores are doubled to keep the halves integral.
    """
    base = sum(matrix[a][b] for a, b in combinations(fixed, 2))
    if need == 0:
        return [], base
    # Twice each free GPU's best (need-1) scores to other free GPUs, prefix sums by count.
    half_pairs: dict[int, list[int]] = {}
    for c in free:
        tops = sorted((matrix[c][o] for o in free if o != c), reverse=True)[: max(need - 1, 0)]
        prefix = [0]
        for t in tops:
            prefix.append(prefix[-1] + t)
        half_pairs[c] = prefix

    to_fixed = {c: sum(matrix[c][f] for f in fixed) for c in free}
    best_score = -1
    best_pick: list[int] = []
    pick: list[int] = []

    def search(start: int, score: int, gains: dict[int, int]) -> None:
        # ``gains[c]`` = score c would add to the chosen set so far (fixed + pick).
        nonlocal best_score, best_pick
        r = need - len(pick)
        if r == 0:
            if score > best_score:
                best_score, best_pick = score, list(pick)
            return
        rest = free[start:]
        if len(rest) < r:
            return
        optimistic = sorted((2 * gains[c] + half_pairs[c][r - 1] for c in rest), reverse=True)
        # <= because a later set with an equal score would lose the tie-break anyway.
        if 2 * score + sum(optimistic[:r]) <= 2 * best_score:
            return
        for i in range(start, len(free) - r + 1):
            c = free[i]
            pick.append(c)
            search(
                i + 1,
                score + gains[c],
                {o: gains[o] + matrix[c][o] for o in free[i + 1 :]},
            )
            pick.pop()

    search(0, base, to_fixed)
    return best_pick, best_score


# --- time-slicing replicas -------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaId:
    """One advertised replica id split into its GPU and replica number."""

    device_id: str
    gpu: GpuUuid
    replica: int


def pick_replicas(
    replicas: Sequence[ReplicaId],
    available: Iterable[str],
    must_include: Iterable[str],
    size: int,
    policy: ReplicaPolicy,
) -> tuple[str, ...]:
    """Choose ``size`` replica ids (must-include ones first) spread over GPUs per ``policy``.

    ``replicas`` is every advertised replica id of the resource, which gives each GPU's total;
    "in use" for a GPU is its total minus its available ids (as NVIDIA computes it). Ties on
    usage go to the GPU picked least often in this request (so ``distributed`` spreads one
    request), then to the GPU that comes first in ``replicas``, then to the lowest replica
    number — all deterministic.
    """
    by_id = {r.device_id: r for r in replicas}
    avail = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    unknown = [i for i in [*avail, *must] if i not in by_id]
    if unknown:
        raise PreferenceError(f"unknown device id {unknown[0]}")
    if size < len(must):
        raise PreferenceError(f"size {size} is smaller than the {len(must)} must-include ids")
    candidates = [i for i in avail if i not in set(must)]
    if size - len(must) > len(candidates):
        raise PreferenceError(f"size {size} exceeds the {len(candidates) + len(must)} available")

    gpu_order: dict[GpuUuid, int] = {}
    total: dict[GpuUuid, int] = {}
    for r in replicas:
        gpu_order.setdefault(r.gpu, len(gpu_order))
        total[r.gpu] = total.get(r.gpu, 0) + 1
    free_by_gpu: dict[GpuUuid, list[ReplicaId]] = {}
    for i in candidates:
        free_by_gpu.setdefault(by_id[i].gpu, []).append(by_id[i])
    for ids in free_by_gpu.values():
        ids.sort(key=lambda r: r.replica)
    # Must-include ids are already taken, so they count as in use (NVIDIA drops them from the
    # candidates first, which has the same effect).
    in_use = {g: total[g] - len(free_by_gpu.get(g, [])) for g in total}
    picked_here = {g: 0 for g in total}
    for i in must:
        picked_here[by_id[i].gpu] += 1

    chosen = list(must)
    sign = -1 if policy is ReplicaPolicy.PACKED else 1
    for _ in range(size - len(must)):
        gpu = min(
            (g for g, ids in free_by_gpu.items() if ids),
            key=lambda g: (sign * in_use[g], picked_here[g], gpu_order[g]),
        )
        chosen.append(free_by_gpu[gpu].pop(0).device_id)
        in_use[gpu] += 1
        picked_here[gpu] += 1
    return tuple(chosen)
