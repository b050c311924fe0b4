"""The placement engine's values: what a pod asks for and what a node has free.

These are our own types (frozen, units in names); the extender converts Kubernetes objects
into them at its edge and the simulator converts trace rows. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

MILLI_PER_GPU = 1000


@dataclass(frozen=True)
class PodRequest:
    """What one pod needs.

    GPU demand comes in three shapes, mirroring the openb traces and the device plugin:
    ``gpu_count == 0`` (CPU only), ``gpu_count == 1`` with ``gpu_milli < 1000`` (a share of one
    card) and ``gpu_milli == 1000`` with any ``gpu_count`` (whole cards, all on one node).
    ``gpu_memory_mib`` is the card memory a share needs (``None``: not constrained);
    ``gpu_models`` lists allowed card models (empty: any model).
    """

    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int | None = None
    gpu_models: frozenset[str] = frozenset()
    name: str = ""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(f"pod {self.name}: negative CPU or memory request")
        if self.gpu_count < 0:
            raise ValueError(f"pod {self.name}: negative GPU count")
        if self.gpu_count == 0 and self.gpu_milli != 0:
            raise ValueError(f"pod {self.name}: gpu_milli without a GPU count")
        if self.gpu_count > 0 and not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise ValueError(f"pod {self.name}: gpu_milli must be in (0, 1000]")
        if self.gpu_count > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise ValueError(f"pod {self.name}: multi-GPU pods take whole cards (gpu_milli 1000)")

    @property
    def is_gpu_share(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli

    @property
    def affinity_tag(self) -> str:
        """GpuClustering's pod class: "no-gpu", "share-gpu" or "<k>-gpu"."""
        if self.gpu_count == 0:
            return "no-gpu"
        if self.is_gpu_share:
            return "share-gpu"
        return f"{self.gpu_count}-gpu"

    def allows_model(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models

    def card_milli(self, card_memory_mib: int | None) -> int:
        """Milli of a card of ``card_memory_mib`` (``None``: memory not known) each of this
        pod's cards takes: a share's level (:func:`share_milli`), else its ``gpu_milli``."""
        if not self.is_gpu_share:
            return self.gpu_milli
        return share_milli(self.gpu_milli, self.gpu_memory_mib, card_memory_mib)


def share_milli(gpu_milli: int, gpu_memory_mib: int | None, card_memory_mib: int | None) -> int:
    """How much of a card a share takes, in milli of the card: the larger of its compute and
    its memory as a fraction of the card's (``card_memory_mib``; ``None``: memory not
    tracked, the compute alone). The one definition every policy scores a share by, so a
    share asking only memory (1 milli of compute, every peer pod) weighs what it holds.

    Rounded down, as :func:`card_level` is: a card whose memory fits the share then has at
    least its level. Capped below a whole card, so a share stays a share."""
    if gpu_memory_mib is None or not card_memory_mib or card_memory_mib <= 0:
        return gpu_milli
    by_memory = gpu_memory_mib * MILLI_PER_GPU // card_memory_mib
    return min(max(gpu_milli, by_memory), MILLI_PER_GPU - 1)


def card_level(free_milli: int, free_memory_mib: int | None, memory_mib: int | None) -> int:
    """How much of a card is free, in milli of the card: the smaller of its free compute and
    its free memory as a fraction of its memory (``memory_mib``; ``None``: not tracked, the
    compute alone). What policies score a card by (:func:`share_milli` is the other side)."""
    if free_memory_mib is None or not memory_mib or memory_mib <= 0:
        return free_milli
    return max(0, min(free_milli, free_memory_mib * MILLI_PER_GPU // memory_mib))


@dataclass(frozen=True)
class GpuState:
    """One card's free capacity. ``free_memory_mib`` is ``None`` when memory is not tracked;
    ``memory_mib`` is the card's whole memory (``None``: not known, and then policies weigh
    the card by compute alone, see :func:`card_level`); ``model`` is the card's model, ``""``
    for the node's :attr:`NodeState.gpu_model` (so a node of one model names it once, and a
    node of several names it on each card)."""

    index: int
    free_milli: int = MILLI_PER_GPU
    free_memory_mib: int | None = None
    model: str = ""
    memory_mib: int | None = None


@dataclass(frozen=True)
class NodeState:
    """One node's free resources as the scheduler sees them.

    ``rank`` is the deterministic tie-break: among equal scores the smallest rank wins (the
    paper's simulator breaks ties by node name, which it prefixes with a seeded rank; live we
    use the name order). ``affinity_counts`` counts GPU pods on the node per
    :attr:`PodRequest.affinity_tag` (only GpuClustering reads it). ``gpu_model`` is the model
    of every card that does not name its own (:attr:`GpuState.model`); a node with cards of
    several models names them per card (see :attr:`card_models`).
    """

    name: str
    cpu_capacity_milli: int
    cpu_free_milli: int
    memory_free_mib: int
    gpu_model: str = ""
    gpus: tuple[GpuState, ...] = ()
    rank: int = 0
    affinity_counts: Mapping[str, int] = field(default_factory=dict, hash=False, compare=False)

    @property
    def card_models(self) -> tuple[str, ...]:
        """Each card's model, in device-index order."""
        return tuple(g.model or self.gpu_model for g in sorted(self.gpus, key=lambda g: g.index))

    def with_allocation(self, pod: PodRequest, gpu_indices: tuple[int, ...]) -> NodeState:
        """The node after ``pod`` is bound to it on ``gpu_indices``."""
        return self._apply(pod, gpu_indices, sign=-1)

    def without_allocation(self, pod: PodRequest, gpu_indices: tuple[int, ...]) -> NodeState:
        """The node after ``pod`` (previously on ``gpu_indices``) has gone."""
        return self._apply(pod, gpu_indices, sign=+1)

    def _apply(self, pod: PodRequest, gpu_indices: tuple[int, ...], sign: int) -> NodeState:
        if len(gpu_indices) != pod.gpu_count:
            raise ValueError(
                f"node {self.name}: pod {pod.name} needs {pod.gpu_count} GPUs, got {gpu_indices}"
            )
        by_index = {g.index: g for g in self.gpus}
        new_gpus = list(self.gpus)
        position = {g.index: i for i, g in enumerate(self.gpus)}
        for idx in gpu_indices:
            if idx not in by_index:
                raise ValueError(f"node {self.name}: no GPU {idx}")
            gpu = by_index[idx]
            free_milli = gpu.free_milli + sign * pod.gpu_milli
            if not 0 <= free_milli <= MILLI_PER_GPU:
                raise ValueError(f"node {self.name}: GPU {idx} would have {free_milli} milli free")
            memory = gpu.free_memory_mib
            if memory is not None and pod.gpu_memory_mib is not None:
                memory += sign * pod.gpu_memory_mib
            new_gpus[position[idx]] = replace(gpu, free_milli=free_milli, free_memory_mib=memory)
        counts = dict(self.affinity_counts)
        if pod.gpu_count:
            tag = pod.affinity_tag
            counts[tag] = counts.get(tag, 0) - sign
            if counts[tag] <= 0:
                del counts[tag]
        return replace(
            self,
            cpu_free_milli=self.cpu_free_milli + sign * pod.cpu_milli,
            memory_free_mib=self.memory_free_mib + sign * pod.memory_mib,
            gpus=tuple(new_gpus),
            affinity_counts=counts,
        )


@dataclass(frozen=True)
class Fit:
    """Whether a pod fits a node; ``reason`` says why not, for the extender's FailedNodes."""

    node: str
    fits: bool
    reason: str = ""


@dataclass(frozen=True)
class Placement:
    """Where the engine put (or would put) a pod: node, card indices, and the winning score."""

    node: str
    gpu_indices: tuple[int, ...]
    score: int
