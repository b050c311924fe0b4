"""Our policy's waste potential: how much free GPU a placement dooms to stay unused.

FGD (``fragmentation``) asks, per node, which typical pods could still land there. Measured on
the openb traces, what it leaves idle once the cluster is full is almost all of two kinds, and
FGD's measure sees neither well:

* **Card gaps nothing common can fill.** A share that leaves a card with 60 milli free, or
  190 after an 810-milli pod, strands that sliver for good. FGD counts a card as useful for a
  class whenever the class fits in it, not what the card is left with once it does. Here a
  gap of ``g`` milli is worth ``gap_waste[g]``: ``g`` minus the most that the *common* share
  sizes can pack into it (unbounded knapsack). Only sizes that make up most of the sharing
  pods count (``common_share_percent``): rare sizes (160, 110, 50 milli on openb) would
  make almost every gap look fillable, yet there are far too few of them to fill the gaps
  that exist (a hundred 160-milli pods against a thousand 190-milli gaps).
* **Cards whose node runs out of CPU.** GPU pods need CPU with their cards; a node whose free
  CPU cannot carry its free GPU at the workload's CPU-per-GPU ratio strands the difference.
  ``stranded(G, cpu) = max(0, G − cpu / ρ)``, with ρ the target workload's CPU milli per GPU
  milli (about 11 cores per card on openb). On openb this is about a quarter of what FGD
  leaves idle at 100 % arrived (``bench/kubegpu_sensitivity.py --breakdown``).

A placement's cost is the growth of both, in milli-GPU: ``Δgap_waste + cpu_weight · Δstranded``.
The engine orders nodes by that cost in ``bucket_milli`` buckets, then by FGD's own score,
then by rank (see ``PlacementEngine._kubegpu_keys``). The three constants of
:class:`WasteWeights` were measured, not derived: see docs/benchmarks.md, "07-Kubegpu", and
``bench/kubegpu_sensitivity.py``.

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


@dataclass(frozen=True)
class WasteWeights:
    """Our policy's measured constants."""

    # Share sizes counted as fillers: the most common ones, covering this much of the sharing
    # pods' weight.
    common_share_percent: float = 85.0
    # Weight of a milli-GPU stranded by CPU against one left in an unfillable card gap.
    cpu_weight: float = 0.75
    # Costs within one bucket tie (then FGD's score and the rank decide): about one point of
    # FGD's score near zero growth, so equal-looking placements consolidate on low-rank nodes.
    bucket_milli: float = 40.0


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
    workload: TypicalWorkload, percent: float = WasteWeights.common_share_percent
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
    weights: WasteWeights = WasteWeights()
    _growth_by_free: dict[int, FloatArray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_workload(
        cls, workload: TypicalWorkload, weights: WasteWeights = WasteWeights()
    ) -> WastePotential:
        sizes = common_share_sizes(workload, weights.common_share_percent)
        return cls(gap_waste_table(sizes), cpu_per_gpu_milli(workload), weights)

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

    def stranded_buckets(
        self, gpu_free: FloatArray, cpu_free: FloatArray, gpu_taken: int, cpu_taken: int
    ) -> FloatArray:
        """Per node, the cost bucket of a pod that leaves no card gap (whole cards, CPU only)."""
        growth = self.stranded_growth(gpu_free, cpu_free, gpu_taken, cpu_taken)
        return np.floor(np.round(self.weights.cpu_weight * growth, 6) / self.weights.bucket_milli)

    def share_buckets(
        self,
        card_free: npt.NDArray[np.int64],
        gpu_free: FloatArray,
        cpu_free: FloatArray,
        share_milli: int,
        cpu_taken: int,
    ) -> FloatArray:
        """Per (node, card), the cost bucket of a share landing on that card (+inf where it
        does not fit): the card's gap growth plus its node's weighted stranded growth."""
        gap = self.gap_growth_by_free(share_milli)[card_free + 1]
        stranded = self.stranded_growth(gpu_free, cpu_free, share_milli, cpu_taken)
        # Gap growth is a whole number of milli; rounding the stranded part keeps float noise
        # from moving a cost across a bucket boundary.
        weighted = np.round(self.weights.cpu_weight * stranded, 6)
        bucket: FloatArray = np.floor((gap + weighted[:, None]) / self.weights.bucket_milli)
        return bucket
