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
The engine orders nodes by that cost in ``bucket_milli`` buckets, then by a tie-break per
kind of pod (a share's tightest card, a whole-card pod's FGD score, a CPU-only pod's
fragmentation growth), then by rank (see
``kubegpu.placement.policies.kubegpu.KubegpuScorer.keys``). The bucket is derived; the share
percentage and the CPU weight of :class:`WasteWeights` are chosen by the protocol in
docs/benchmarks.md ("Model-constrained traces … and the tuning protocol",
``bench/model_constrained.py --protocol``).

Pure and numpy-only, like the rest of the placement core.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from kubegpu.placement.fragmentation import TypicalPod, TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class WasteWeights:
    """Our policy's measured constants."""

    # Share sizes counted as fillers: the most common ones, covering this much of the sharing
    # pods' weight.
    common_share_percent: float = 85.0
    # Weight of a milli-GPU stranded by CPU against one left in an unfillable card gap.
    cpu_weight: float = 0.5
    # Costs within one bucket tie (then best fit, FGD's score or the growth, and the rank
    # decide): about one point of FGD's score near zero growth, so equal-looking placements
    # consolidate on low-rank nodes.
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
    pods, or when they ask no CPU (then nothing counts as stranded: free CPU carries any GPU,
    and a ρ of 0 would divide by zero)."""
    cpu = sum(t.weight * t.cpu_milli for t in workload.pods if t.gpu_count)
    gpu = sum(t.weight * t.gpu_count * t.gpu_milli for t in workload.pods if t.gpu_count)
    return cpu / gpu if gpu > 0 and cpu > 0 else None


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


def _allowed_share(models: frozenset[str], capacity: Mapping[str, int]) -> dict[str, float]:
    """Where a class's demand goes if it spreads over its allowed models by their capacity:
    model -> fraction (empty when none of its models is in the cluster)."""
    allowed = {m: c for m, c in capacity.items() if c > 0 and (not models or m in models)}
    total = sum(allowed.values())
    return {m: c / total for m, c in allowed.items()} if total else {}


@dataclass(frozen=True)
class ModelWaste:
    """The waste potential per card model, for a cluster whose pods may be limited to models.

    A card of model ``m`` is filled by the pods that may use ``m``, so its gap table, common
    share sizes and CPU-per-GPU ratio come from the target workload seen from ``m``: every
    class weighted by the part of its demand that would land on ``m`` if it spread over its
    allowed models by their capacity (an unconstrained class: ``m``'s share of all cards; a
    class limited to ``m``: all of it).

    ``pressure[m]``: the share of ``m``'s capacity that pods *limited* to models (so with
    fewer places to go) will need once the cluster's demand reaches its capacity, capped
    at 1. Each milli-GPU a pod takes on ``m`` costs that much expected doomed waste, so pods
    with a choice leave the models constrained pods need to them. All of it is derived from
    the workload and the cluster; a workload without model limits gives one pooled entry,
    pressure 0 (exactly the single-model potential).
    """

    models: tuple[str, ...]  # index -> model; index len(models) is the pooled entry
    potentials: tuple[WastePotential, ...]  # per index, pooled last
    pressure: FloatArray  # per index, pooled (0) last
    rho: FloatArray  # CPU milli per milli-GPU per index; NaN: nothing counts as stranded
    weights: WasteWeights
    _gap_tables: dict[int, FloatArray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _gap_lists: dict[int, list[list[float]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        workload: TypicalWorkload,
        capacity_by_model: Mapping[str, int],
        weights: WasteWeights = WasteWeights(),
    ) -> ModelWaste:
        pooled = WastePotential.from_workload(workload, weights)
        constrained = any(t.gpu_count and t.gpu_models for t in workload.pods)
        models = tuple(sorted(m for m, c in capacity_by_model.items() if c > 0))
        if not constrained or not models:
            return cls._of((), (pooled,), [0.0], weights)
        spread = [_allowed_share(t.gpu_models, capacity_by_model) for t in workload.pods]
        potentials: list[WastePotential] = []
        for m in models:
            seen = tuple(
                TypicalPod(t.cpu_milli, t.gpu_milli, t.gpu_count, t.gpu_models, t.weight * s[m])
                for t, s in zip(workload.pods, spread, strict=True)
                if s.get(m, 0.0) > 0.0 or not t.gpu_count
            )
            potentials.append(WastePotential.from_workload(TypicalWorkload(seen), weights))
        demand = sum(t.weight * t.gpu_count * t.gpu_milli for t in workload.pods)
        capacity = sum(capacity_by_model[m] for m in models)
        pressure: list[float] = []
        for m in models:
            limited = sum(
                t.weight * t.gpu_count * t.gpu_milli * s.get(m, 0.0)
                for t, s in zip(workload.pods, spread, strict=True)
                if t.gpu_count and t.gpu_models
            )
            need = limited / demand * capacity if demand > 0 else 0.0
            pressure.append(min(1.0, need / capacity_by_model[m]))
        return cls._of(models, (*potentials, pooled), [*pressure, 0.0], weights)

    @classmethod
    def _of(
        cls,
        models: tuple[str, ...],
        potentials: tuple[WastePotential, ...],
        pressure: list[float],
        weights: WasteWeights,
    ) -> ModelWaste:
        rho = np.array(
            [np.nan if p.cpu_per_gpu_milli is None else p.cpu_per_gpu_milli for p in potentials]
        )
        return cls(models, potentials, np.array(pressure, dtype=np.float64), rho, weights)

    def index(self, model: str) -> int:
        """The entry for cards of ``model`` (the pooled one for unknown or mixed models)."""
        try:
            return self.models.index(model)
        except ValueError:
            return len(self.models)

    def gap_growth(self, share_milli: int) -> FloatArray:
        """Per entry (rows) and free milli + 1 (columns, −1 … 1000), a share's gap growth."""
        table = self._gap_tables.get(share_milli)
        if table is None:
            table = np.stack([p.gap_growth_by_free(share_milli) for p in self.potentials])
            self._gap_tables[share_milli] = table
        return table

    def stranded(self, entry: IntArray, gpu_free: FloatArray, cpu_free: FloatArray) -> FloatArray:
        """Per node, free milli-GPU its free CPU cannot carry at its model's ratio."""
        if len(self.potentials) == 1:  # one ratio for all: no per-node gather
            rho: FloatArray | float = float(self.rho[0])
            if np.isnan(rho):
                return np.zeros_like(gpu_free, dtype=np.float64)
            return np.maximum(0.0, gpu_free - np.maximum(cpu_free, 0) / rho)
        rho = self.rho[entry]
        carried = np.maximum(cpu_free, 0) / np.where(np.isnan(rho), 1.0, rho)
        return np.where(np.isnan(rho), 0.0, np.maximum(0.0, gpu_free - carried))

    def stranded_growth(
        self,
        entry: IntArray,
        gpu_free: FloatArray,
        cpu_free: FloatArray,
        gpu_taken: int,
        cpu_taken: int,
    ) -> FloatArray:
        after = self.stranded(entry, gpu_free - gpu_taken, cpu_free - cpu_taken)
        return after - self.stranded(entry, gpu_free, cpu_free)

    def stranded_buckets(
        self,
        entry: IntArray,
        gpu_free: FloatArray,
        cpu_free: FloatArray,
        gpu_taken: int,
        cpu_taken: int,
    ) -> FloatArray:
        """Per node, the cost bucket of a pod that leaves no card gap: its stranded growth
        (weighted) plus the pressure on the model of the cards it takes."""
        growth = self.stranded_growth(entry, gpu_free, cpu_free, gpu_taken, cpu_taken)
        cost = self.weights.cpu_weight * growth
        if len(self.potentials) > 1:  # pressure is 0 with one pooled entry
            cost = cost + self.pressure[entry] * gpu_taken
        return np.floor(np.round(cost, 6) / self.weights.bucket_milli)

    def share_buckets(
        self,
        entry: IntArray,
        card_free: npt.NDArray[np.int64],
        gpu_free: FloatArray,
        cpu_free: FloatArray,
        share_milli: int,
        cpu_taken: int,
    ) -> FloatArray:
        """Per (node, card), the cost bucket of a share on that card (+inf where it does not
        fit): the card's gap growth, its node's weighted stranded growth, the pressure."""
        stranded = self.stranded_growth(entry, gpu_free, cpu_free, share_milli, cpu_taken)
        other = self.weights.cpu_weight * stranded
        if len(self.potentials) == 1:  # one table, no pressure: a plain lookup
            gap = self.gap_growth(share_milli)[0][card_free + 1]
        else:
            gap = self.gap_growth(share_milli)[entry[:, None], card_free + 1]
            other = other + self.pressure[entry] * share_milli
        bucket: FloatArray = np.floor(
            (gap + np.round(other, 6)[:, None]) / self.weights.bucket_milli
        )
        return bucket

    # ------------------------------------------------------------- one node, in Python floats
    # The engine prices the one or two nodes whose state is new since a pod class last came
    # with these: numpy's fixed cost per call is most of the work on so few. Each does the
    # vectorised method's IEEE operations in the same order on Python floats (a float64 each),
    # so it gives the same values (tests/placement/test_waste_scalar.py holds them equal).

    @cached_property
    def _rho_list(self) -> list[float]:
        return [float(r) for r in self.rho.tolist()]

    @cached_property
    def _pressure_list(self) -> list[float]:
        return [float(p) for p in self.pressure.tolist()]

    def stranded_growth_one(
        self, entry: int, gpu_free: float, cpu_free: float, gpu_taken: int, cpu_taken: int
    ) -> float:
        """:meth:`stranded_growth` of one node, :meth:`stranded`'s operations on Python
        floats (``np.maximum(a, b)`` is ``a if a >= b else b``; NaN cannot occur, and a zero
        of either sign compares, buckets and sorts as any other zero)."""
        rho = self._rho_list[0 if len(self.potentials) == 1 else entry]
        if math.isnan(rho):
            return 0.0
        cpu_after = cpu_free - cpu_taken
        after = (gpu_free - gpu_taken) - (cpu_after if cpu_after >= 0.0 else 0.0) / rho
        before = gpu_free - (cpu_free if cpu_free >= 0.0 else 0.0) / rho
        return (0.0 if after <= 0.0 else after) - (0.0 if before <= 0.0 else before)

    def stranded_bucket_one(
        self, entry: int, gpu_free: float, cpu_free: float, gpu_taken: int, cpu_taken: int
    ) -> float:
        """:meth:`stranded_buckets` of one node."""
        growth = self.stranded_growth_one(entry, gpu_free, cpu_free, gpu_taken, cpu_taken)
        cost = self.weights.cpu_weight * growth
        if len(self.potentials) > 1:
            cost = cost + self._pressure_list[entry] * gpu_taken
        return numpy_floor(numpy_round6(cost) / self.weights.bucket_milli)

    def _share_terms_one(
        self, entry: int, gpu_free: float, cpu_free: float, share_milli: int, cpu_taken: int
    ) -> tuple[list[float], float]:
        """A share's per-card gap growth by free milli + 1 (the node's entry's row) and its
        node's other cost, rounded: a card's bucket is ``floor((gap[free + 1] + other) /
        bucket_milli)``."""
        stranded = self.stranded_growth_one(entry, gpu_free, cpu_free, share_milli, cpu_taken)
        other = self.weights.cpu_weight * stranded
        gaps = self._gap_lists.get(share_milli)
        if gaps is None:
            gaps = [[float(v) for v in row] for row in self.gap_growth(share_milli).tolist()]
            self._gap_lists[share_milli] = gaps
        if len(self.potentials) == 1:
            return gaps[0], numpy_round6(other)
        other = other + self._pressure_list[entry] * share_milli
        return gaps[entry], numpy_round6(other)

    def share_buckets_one(
        self,
        entry: int,
        card_free: list[int],
        gpu_free: float,
        cpu_free: float,
        share_milli: int,
        cpu_taken: int,
    ) -> list[float]:
        """:meth:`share_buckets` of one node's cards (``card_free`` in column order)."""
        gap, rounded = self._share_terms_one(entry, gpu_free, cpu_free, share_milli, cpu_taken)
        bucket = self.weights.bucket_milli
        # Cards of equal free milli price alike: each value once.
        by_free: dict[int, float] = {}
        out: list[float] = []
        for free in card_free:
            value = by_free.get(free)
            if value is None:
                value = by_free[free] = numpy_floor((gap[free + 1] + rounded) / bucket)
            out.append(value)
        return out

    def share_best_one(
        self,
        entry: int,
        sorted_free: tuple[int, ...],
        gpu_free: float,
        cpu_free: float,
        share_milli: int,
        cpu_taken: int,
    ) -> tuple[float, int]:
        """The least bucket of :meth:`share_buckets_one` on a node of one model, and the
        least free milli among the cards with it (best fit), from its cards' free milli in
        ascending order: ``(inf, 0)`` when no card fits."""
        gap, rounded = self._share_terms_one(entry, gpu_free, cpu_free, share_milli, cpu_taken)
        bucket = self.weights.bucket_milli
        best, best_free = math.inf, 0
        previous = -1
        for free in sorted_free:
            if free == previous or free < share_milli:  # equal cards price alike
                continue
            previous = free
            value = numpy_floor((gap[free + 1] + rounded) / bucket)
            if value < best:  # ascending free: the first of the least is the tightest
                best, best_free = value, free
        return best, best_free


def numpy_round6(value: float) -> float:
    """``np.round(value, 6)``: numpy multiplies by 10⁶, rounds half to even and divides back
    (Python's ``round`` of a float to an integer rounds half to even too, exactly)."""
    scaled = value * 1e6
    return float(round(scaled)) / 1e6 if math.isfinite(scaled) else scaled


def numpy_floor(value: float) -> float:
    """``np.floor(value)`` (±inf stay as they are)."""
    return float(math.floor(value)) if math.isfinite(value) else value
