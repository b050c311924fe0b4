"""Our policy's waste potential: how much free GPU a placement dooms to stay unused.

FGD (``fragmentation``) asks, per node, which typical pods could still land there. Measured on
the openb traces, two things it does not see account for most of what it leaves idle once the
cluster is full:

* **Card gaps nothing common can fill.** A share that leaves a card with 60 milli free, or
  190 after an 810-milli pod, strands that sliver for good. FGD counts a card as useful for a
  class whenever the class fits in it, not what the card is left with once it does. Here a
  gap of ``g`` milli is worth ``gap_waste[g]``: ``g`` minus the most that the *common* share
  sizes can pack into it (unbounded knapsack). Only sizes that make up most of the sharing
  pods count (:data:`COMMON_SHARE_PERCENT`): rare sizes (160, 110, 50 milli on openb) would
  make almost every gap look fillable, yet there are far too few of them to fill the gaps
  that exist (a hundred 160-milli pods against a thousand 190-milli gaps).
* **Cards whose node runs out of CPU.** GPU pods need CPU with their cards; a node whose free
  CPU cannot carry its free GPU at the workload's CPU-per-GPU ratio strands the difference.
  ``stranded(G, cpu) = max(0, G − cpu / ρ)``, with ρ the target workload's CPU milli per GPU
  milli (about 11 cores per card on openb). On openb this was over half of what FGD leaves
  idle on the CPU-heavy and multi-GPU traces (e.g. 0.7 of 3.1 % on multigpu40).

A placement's cost is the growth of both, in milli-GPU: ``Δgap_waste + CPU_WEIGHT · Δstranded``.
The engine orders nodes by that cost in :data:`COST_BUCKET_MILLI` buckets, then by FGD's own
score, then by rank (see ``PlacementEngine._kubegpu_keys``). The weights and bucket were
measured, not derived: see docs/benchmarks.md, "07-Kubegpu".

Pure and numpy-only, like the rest of the placement core.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU

FloatArray = npt.NDArray[np.float64]

# Share sizes counted as fillers: the most common ones, covering this much of the sharing pods.
COMMON_SHARE_PERCENT = 85.0
# Weight of a milli-GPU stranded by CPU against a milli-GPU left in an unfillable card gap.
CPU_WEIGHT = 0.75
# Costs within one bucket tie (and then FGD's score and the rank decide): about one point of
# FGD's score near zero growth, so equal-looking placements consolidate on low-rank nodes.
COST_BUCKET_MILLI = 40.0


def gap_waste_table(sizes: Iterable[int]) -> FloatArray:
    """``table[g]`` for g in 0…1000: the part of a ``g``-milli card gap that shares of the
    given sizes cannot fill (unbounded knapsack). A fully free card (g = 1000) is no waste:
    whole-card pods use it as it is."""
    usable = sorted({s for s in sizes if 0 < s < MILLI_PER_GPU})
    packed = np.zeros(MILLI_PER_GPU + 1, dtype=np.int64)
    for gap in range(1, MILLI_PER_GPU + 1):
        best = packed[gap - 1]  # a gap packs at least what one milli less does
        for size in usable:
            if size > gap:
                break
            best = max(best, packed[gap - size] + size)
        packed[gap] = best
    table = (np.arange(MILLI_PER_GPU + 1) - packed).astype(np.float64)
    table[MILLI_PER_GPU] = 0.0
    return table


def common_share_sizes(
    workload: TypicalWorkload, percent: float = COMMON_SHARE_PERCENT
) -> list[int]:
    """The most likely share sizes (milli of one card) covering ``percent`` of the sharing
    pods' weight, most likely first (ties: the larger size first)."""
    weights: dict[int, float] = {}
    for t in workload.pods:
        if t.gpu_count == 1 and 0 < t.gpu_milli < MILLI_PER_GPU:
            weights[t.gpu_milli] = weights.get(t.gpu_milli, 0.0) + t.weight
    total = sum(weights.values())
    kept: list[int] = []
    cumulative = 0.0
    for size, weight in sorted(weights.items(), key=lambda kv: (-kv[1], -kv[0])):
        if cumulative >= percent / 100.0 * total - 1e-12:
            break
        kept.append(size)
        cumulative += weight
    return kept


def cpu_per_gpu_milli(workload: TypicalWorkload) -> float | None:
    """ρ: the GPU pods' CPU milli per milli-GPU, weighted by likelihood; ``None`` without GPU
    pods (then nothing counts as stranded)."""
    cpu = sum(t.weight * t.cpu_milli for t in workload.pods if t.gpu_count)
    gpu = sum(t.weight * t.gpu_count * t.gpu_milli for t in workload.pods if t.gpu_count)
    return cpu / gpu if gpu > 0 else None


@dataclass(frozen=True)
class WastePotential:
    """The two parts of the cost, fixed for one target workload."""

    gap_waste: FloatArray  # indexed by a card's free milli, 0…1000
    cpu_per_gpu_milli: float | None
    _growth_by_free: dict[int, FloatArray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_workload(cls, workload: TypicalWorkload) -> WastePotential:
        return cls(gap_waste_table(common_share_sizes(workload)), cpu_per_gpu_milli(workload))

    def stranded(self, gpu_free_milli: FloatArray, cpu_free_milli: FloatArray) -> FloatArray:
        """Free milli-GPU a node's free CPU cannot carry at the workload's ratio."""
        if self.cpu_per_gpu_milli is None:
            return np.zeros_like(gpu_free_milli, dtype=np.float64)
        carried = np.maximum(cpu_free_milli, 0) / self.cpu_per_gpu_milli
        return np.maximum(0.0, gpu_free_milli - carried)

    def stranded_growth(
        self, gpu_free: FloatArray, cpu_free: FloatArray, gpu_taken: int, cpu_taken: int
    ) -> FloatArray:
        """How much more is stranded once a pod takes ``gpu_taken`` and ``cpu_taken``."""
        after = self.stranded(gpu_free - gpu_taken, cpu_free - cpu_taken)
        return after - self.stranded(gpu_free, cpu_free)

    def card_gap_growth(self, card_free: npt.NDArray[np.int64], share_milli: int) -> FloatArray:
        """Per card, the growth of its unfillable gap if a share of ``share_milli`` lands on
        it (cards it does not fit, and absent card slots (free −1), get +inf)."""
        return self.gap_growth_by_free(share_milli)[np.asarray(card_free) + 1]

    def gap_growth_by_free(self, share_milli: int) -> FloatArray:
        """:meth:`card_gap_growth` as a table indexed by free milli + 1 (−1 … 1000), made once
        per share size: the extender and the simulator look it up for every card."""
        table = self._growth_by_free.get(share_milli)
        if table is None:
            free = np.arange(-1, MILLI_PER_GPU + 1)
            fits = free >= share_milli
            before = self.gap_waste[np.clip(free, 0, MILLI_PER_GPU)]
            after = self.gap_waste[np.clip(free - share_milli, 0, MILLI_PER_GPU)]
            table = np.where(fits, after - before, np.inf)
            self._growth_by_free[share_milli] = table
        return table
