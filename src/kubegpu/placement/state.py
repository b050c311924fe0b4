"""A cluster's free resources as numpy arrays: the placement engine's state and its bookkeeping.

One row per node, one column per card slot, so a policy scores every node with a handful of
vector operations and binding a pod updates one row. This module owns the arrays and every
change to them; feasibility (:mod:`~kubegpu.placement.feasibility`), explanations
(:mod:`~kubegpu.placement.explain`) and the policies (:mod:`~kubegpu.placement.policies`)
only read them.

Node order: rows are sorted by (rank, name) once, so "highest score, ties to the smallest
rank" is simply the first maximum (``np.argmax``). Card order: columns are the node's cards
sorted by device index, so "lowest index" is the first column.

Card levels: a card has two free amounts, compute (milli) and memory (MiB), and a pod may ask
for either or both. Feasibility checks both as they are (:attr:`ClusterState.card_compute`,
:attr:`ClusterState.card_memory`); policies score one number per card, its *level*
(:attr:`ClusterState.card_free`): the smaller of the two as milli of the card
(:func:`~kubegpu.placement.model.card_level`), and a share by the larger of its two
(:func:`~kubegpu.placement.model.share_milli`). Where no card's memory is known (the traces)
the level is the compute, and :attr:`card_free` *is* :attr:`card_compute`.

Card models: each card carries its model (a node may mix models, e.g. two V100 and two T4). A
pod restricted to models may use only cards of those models. Most nodes have one model, and
for them a restriction is a per-row yes or no; only rows that mix models, where some but not
all cards are allowed (``ModelSelection.partial``), are checked card by card, and their
fragmentation state names every card's model (see :data:`StateKey`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
FloatArray32 = npt.NDArray[np.float32]

NO_CARD = -1  # free milli of a card slot the node does not have: never fits anything
# Free memory of a card whose memory is not tracked: larger than any request.
UNTRACKED_MEMORY = np.iinfo(np.int64).max // 4
NO_ROWS = np.zeros(0, dtype=np.int64)
T = TypeVar("T")
# Rows made between two calls of a constructor's ``pace`` (~1-2 ms of work).
ROWS_PER_PACE = 100
# Fragmentation states let go between two calls of ``forget_states``'s pace (~0.2 ms).
STATES_PER_PACE = 1000
# A node's fragmentation state: (free CPU, free milli per card, model). On a node of one model
# the free milli are sorted and the model is a string; on a node mixing models they are in
# card order and the model is one per card (a tuple), since which card is which now matters.
StateKey = tuple[int, tuple[int, ...], str | tuple[str, ...]]


class RowShapeChanged(ValueError):
    """A node's cards, card models or CPU capacity changed: its engine row cannot be updated
    in place (build a new engine)."""


@dataclass(frozen=True)
class ModelSelection:
    """Which rows and cards a set of allowed models leaves a pod.

    ``rows``: every card of the row is an allowed model (for a one-model node: its model is
    allowed). ``partial``: rows mixing models with some, not all, cards allowed. ``cards``:
    per (row, column), is that card an allowed model; ``None`` when no row is partial (then a
    card is allowed exactly when its row is).
    """

    rows: npt.NDArray[np.bool_]
    partial: IntArray
    cards: npt.NDArray[np.bool_] | None


def paced(items: Iterable[T], every: int, pace: Callable[[], None] | None) -> Iterator[T]:
    """``items``, calling ``pace`` (when given) after each ``every`` of them: a builder in a
    background thread lets another go first there."""
    for i, item in enumerate(items):
        if pace is not None and i % every == every - 1:
            pace()
        yield item


def _no_pace() -> None:
    pass


class ClusterState:
    """Every node's free CPU, memory and per-card milli and memory, in rank order.

    ``card_compute``: each card's free compute (milli); ``card_memory`` its free memory (MiB,
    :data:`UNTRACKED_MEMORY` when not tracked); ``card_memory_total`` its whole memory (0:
    not known); ``card_free`` its level, what policies score (see the module's docstring).
    ``levels_memory``: some card's memory is known, so levels can differ from compute.

    ``track_states``: also intern each row's fragmentation state (:data:`StateKey`) to a small
    id in :attr:`state_id`, which FGD and our policy cache their per-state values on.
    """

    def __init__(
        self,
        nodes: Sequence[NodeState],
        *,
        track_states: bool = False,
        pace: Callable[[], None] | None = None,
    ) -> None:
        """``pace``, when given, is called every :data:`ROWS_PER_PACE` rows made: a caller
        building in a background thread lets another go first there."""
        tick = pace if pace is not None else _no_pace
        ordered = sorted(nodes, key=lambda n: (n.rank, n.name))
        n = len(ordered)
        width = max((len(node.gpus) for node in ordered), default=0)
        tick()
        self.names: list[str] = [node.name for node in ordered]
        self._row: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        if len(self._row) != n:
            raise ValueError("node names must be unique")
        tick()
        # Per row: each card's model (column order), and one name for messages: the model,
        # or on a node mixing models the distinct models joined by "+".
        self.card_models: list[tuple[str, ...]] = []
        self.models: list[str] = []
        self.mixed: list[bool] = []  # the row's cards are of more than one model
        self.cpu_capacity = np.array([x.cpu_capacity_milli for x in ordered], dtype=np.int64)
        self.cpu_free = np.array([x.cpu_free_milli for x in ordered], dtype=np.int64)
        tick()
        self.memory_free = np.array([x.memory_free_mib for x in ordered], dtype=np.int64)
        self.gpu_count = np.array([len(x.gpus) for x in ordered], dtype=np.int64)
        tick()
        self.card_compute = np.full((n, width), NO_CARD, dtype=np.int64)
        self.card_memory = np.full((n, width), NO_CARD, dtype=np.int64)
        self.card_memory_total = np.zeros((n, width), dtype=np.int64)
        self.card_index: list[tuple[int, ...]] = []
        for i, node in enumerate(paced(ordered, ROWS_PER_PACE, pace)):
            gpus = sorted(node.gpus, key=lambda g: g.index)
            self.card_index.append(tuple(g.index for g in gpus))
            default = node.gpu_model
            card_models = tuple([g.model or default for g in gpus])
            self.card_models.append(card_models)
            name, mixed = _model_name(card_models, node.gpu_model)
            self.models.append(name)
            self.mixed.append(mixed)
            for j, gpu in enumerate(gpus):
                self.card_compute[i, j] = gpu.free_milli
                mem = gpu.free_memory_mib
                self.card_memory[i, j] = UNTRACKED_MEMORY if mem is None else mem
                if mem is not None and gpu.memory_mib:
                    self.card_memory_total[i, j] = gpu.memory_mib
        self.levels_memory = bool(self.card_memory_total.any())
        # Without a known card memory the level is the compute: one array, kept in step by
        # every change for free (and every trace replay scores exactly as before levels).
        self.card_free = self.card_compute.copy() if self.levels_memory else self.card_compute
        # Per row, the smallest known card memory (0: none known): a share's level on the row.
        self.row_card_memory = np.where(
            self.card_memory_total > 0, self.card_memory_total, np.iinfo(np.int64).max
        ).min(axis=1, initial=np.iinfo(np.int64).max)
        self.row_card_memory[self.row_card_memory == np.iinfo(np.int64).max] = 0
        # The distinct card memories, and each row's index into them (a share has one level
        # per card memory, computed once per call rather than per row).
        self.card_memory_sizes, self.row_memory_size = np.unique(
            self.row_card_memory, return_inverse=True
        )
        # Bumped by every change to a row: what a per-call memo checks it is still current by.
        self.version = 0
        self.affinity: list[dict[str, int]] = [dict(x.affinity_counts) for x in ordered]
        self.affinity_arrays: dict[str, IntArray] = {}  # per tag: each row's count, kept fresh
        self.distinct_tags = np.array([len(a) for a in self.affinity], dtype=np.int64)
        self.gpu_free_total = np.zeros(n, dtype=np.int64)
        self.full_cards = np.zeros(n, dtype=np.int64)
        self.largest_card = np.zeros(n, dtype=np.int64)
        self.largest_level = np.zeros(n, dtype=np.int64)
        self.mixed_rows: IntArray = np.flatnonzero(np.array(self.mixed, dtype=bool))
        self._selections: dict[frozenset[str], ModelSelection] = {}
        # Fragmentation state: each row's (free CPU, sorted free milli, model) is interned to a
        # small id; the policies keep per pod class a table id -> value.
        self.track_states = track_states
        self._state_ids: dict[StateKey, int] = {}
        self.state_keys: list[StateKey] = []
        self.state_id = np.zeros(n, dtype=np.int64)
        tick()
        for i in paced(range(n), ROWS_PER_PACE, pace):
            self.refresh_row(i)
        tick()

    # ----------------------------------------------------------------- derived per row
    def capacity_by_model(self) -> dict[str, int]:
        """Milli-GPU of cards per model, over the whole cluster."""
        cards: Counter[str] = Counter()
        for models in self.card_models:
            cards.update(models)
        return {model: count * MILLI_PER_GPU for model, count in cards.items()}

    def refresh_row(self, i: int) -> None:
        """Recompute row ``i``'s derived columns after its free resources changed."""
        self.version += 1
        count = self.gpu_count[i]
        compute = self.card_compute[i, :count]
        if self.levels_memory:
            total = self.card_memory_total[i, :count]
            by_memory = self.card_memory[i, :count] * MILLI_PER_GPU // np.maximum(total, 1)
            self.card_free[i, :count] = np.where(
                total > 0, np.maximum(np.minimum(compute, by_memory), 0), compute
            )
        free = self.card_free[i, :count]
        self.gpu_free_total[i] = int(free.sum())
        self.full_cards[i] = int((free == MILLI_PER_GPU).sum())
        # Feasibility's quick bound: the most compute any one card has free; and the highest
        # level, whether a share's level fits some card of the row (PlacementEngine.levelled).
        self.largest_card[i] = int(compute.max()) if compute.size else NO_CARD
        self.largest_level[i] = int(free.max()) if free.size else NO_CARD
        for tag, array in self.affinity_arrays.items():
            array[i] = self.affinity[i].get(tag, 0)
        self.distinct_tags[i] = len(self.affinity[i])
        if self.track_states:
            key: StateKey
            if self.mixed[i]:
                key = (int(self.cpu_free[i]), tuple(free.tolist()), self.card_models[i])
            else:
                key = (int(self.cpu_free[i]), tuple(sorted(free.tolist())), self.models[i])
            sid = self._state_ids.get(key)
            if sid is None:
                sid = len(self.state_keys)
                self._state_ids[key] = sid
                self.state_keys.append(key)
            self.state_id[i] = sid

    def forget_states(self, pace: Callable[[], None]) -> None:
        """Let go of the fragmentation states met so far, a few at a time, calling ``pace``
        between (for an engine retired: its rows' state ids no longer mean anything)."""
        keys, ids = self.state_keys, self._state_ids
        self.state_keys, self._state_ids = [], {}
        while keys:
            del keys[-STATES_PER_PACE:]
            for _ in range(min(STATES_PER_PACE, len(ids))):
                ids.popitem()
            pace()
        ids.clear()

    def row_key(self, i: int) -> StateKey:
        """Row ``i``'s fragmentation state (see :data:`StateKey`)."""
        free = self.card_free[i, : self.gpu_count[i]].tolist()
        if self.mixed[i]:
            return (int(self.cpu_free[i]), tuple(free), self.card_models[i])
        return (int(self.cpu_free[i]), tuple(sorted(free)), self.models[i])

    def affinity_counts(self, tag: str) -> IntArray:
        """Each row's count of pods of affinity ``tag`` (kept fresh once asked for)."""
        counts = self.affinity_arrays.get(tag)
        if counts is None:
            counts = np.array([a.get(tag, 0) for a in self.affinity], dtype=np.int64)
            self.affinity_arrays[tag] = counts
        return counts

    def model_selection(self, models: frozenset[str]) -> ModelSelection:
        """What ``models`` allows, per row and per card (cached: models never change)."""
        found = self._selections.get(models)
        if found is None:
            rows = np.array([m in models for m in self.models], dtype=bool)
            partial: list[int] = []
            for i in self.mixed_rows.tolist():
                allowed = [m in models for m in self.card_models[i]]
                rows[i] = all(allowed)
                if any(allowed) and not rows[i]:
                    partial.append(i)
            cards = None
            if partial:
                cards = np.repeat(rows[:, None], self.card_free.shape[1], axis=1)
                for i in partial:
                    for j, model in enumerate(self.card_models[i]):
                        cards[i, j] = model in models
            found = ModelSelection(rows, np.array(partial, dtype=np.int64), cards)
            self._selections[models] = found
        return found

    # ----------------------------------------------------------------- by name
    def row_of(self, node: str) -> int:
        try:
            return self._row[node]
        except KeyError:
            raise KeyError(f"unknown node {node!r}") from None

    def node_state(self, node: str) -> NodeState:
        """The current view of one node, as a value (a node of one model names it on the
        node, a node mixing models on each card)."""
        i = self.row_of(node)
        mixed = self.mixed[i]
        gpus = tuple(
            GpuState(
                index,
                int(self.card_compute[i, j]),
                None
                if self.card_memory[i, j] >= UNTRACKED_MEMORY // 2
                else int(self.card_memory[i, j]),
                self.card_models[i][j] if mixed else "",
                int(self.card_memory_total[i, j]) or None,
            )
            for j, index in enumerate(self.card_index[i])
        )
        return NodeState(
            node,
            int(self.cpu_capacity[i]),
            int(self.cpu_free[i]),
            int(self.memory_free[i]),
            "" if mixed else self.models[i],
            gpus,
            rank=i,
            affinity_counts=dict(self.affinity[i]),
        )

    @property
    def gpu_used_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI_PER_GPU - int(self.gpu_free_total.sum())

    # ----------------------------------------------------------------- mutation
    def allocate_row(self, i: int, pod: PodRequest, cols: tuple[int, ...]) -> None:
        self._change_row(i, pod, cols, -1)

    def release_row(self, i: int, pod: PodRequest, cols: tuple[int, ...]) -> None:
        self._change_row(i, pod, cols, +1)

    def _change_row(self, i: int, pod: PodRequest, cols: tuple[int, ...], sign: int) -> None:
        if len(cols) != pod.gpu_count:
            raise ValueError(f"pod {pod.name} needs {pod.gpu_count} cards, got {len(cols)}")
        self.cpu_free[i] += sign * pod.cpu_milli
        self.memory_free[i] += sign * pod.memory_mib
        for col in cols:
            value = int(self.card_compute[i, col]) + sign * pod.gpu_milli
            if not 0 <= value <= MILLI_PER_GPU or col >= self.gpu_count[i]:
                raise ValueError(f"node {self.names[i]}: card {col} cannot hold pod {pod.name}")
            self.card_compute[i, col] = value
            if pod.gpu_memory_mib is not None:
                self.card_memory[i, col] += sign * pod.gpu_memory_mib
        if pod.gpu_count:
            tag = pod.affinity_tag
            counts = self.affinity[i]
            counts[tag] = counts.get(tag, 0) - sign
            if counts[tag] <= 0:
                del counts[tag]
        self.refresh_row(i)

    def update_node(self, state: NodeState) -> None:
        """Overwrite one node's free resources from a fresh value (e.g. the extender's view
        after a watch event). The node must keep its cards, model and CPU capacity; for a
        changed node build a new engine."""
        i = self.row_of(state.name)
        if not self.same_shape(i, state):
            raise RowShapeChanged(
                f"node {state.name}: cards, card models or CPU capacity changed; rebuild the engine"
            )
        gpus = sorted(state.gpus, key=lambda g: g.index)
        self.cpu_free[i] = state.cpu_free_milli
        self.memory_free[i] = state.memory_free_mib
        for j, gpu in enumerate(gpus):
            self.card_compute[i, j] = gpu.free_milli
            mem = gpu.free_memory_mib
            self.card_memory[i, j] = UNTRACKED_MEMORY if mem is None else mem
        self.affinity[i] = dict(state.affinity_counts)
        self.refresh_row(i)

    def same_shape(self, i: int, state: NodeState) -> bool:
        """Whether ``state`` keeps row ``i``'s cards (indices and models) and CPU capacity,
        the row's constants: only then can :meth:`update_node` take it. A card's whole
        memory is one too (it makes the card's level)."""
        gpus = sorted(state.gpus, key=lambda g: g.index)
        totals = tuple((g.memory_mib or 0) if g.free_memory_mib is not None else 0 for g in gpus)
        return (
            tuple(g.index for g in gpus) == self.card_index[i]
            and totals == tuple(self.card_memory_total[i, : len(gpus)].tolist())
            and tuple(g.model or state.gpu_model for g in gpus) == self.card_models[i]
            # Without cards the node's own model is the row's (equal cards imply it otherwise).
            and (bool(gpus) or state.gpu_model == self.models[i])
            and state.cpu_capacity_milli == int(self.cpu_capacity[i])
        )


def _model_name(card_models: tuple[str, ...], node_model: str) -> tuple[str, bool]:
    """A row's model for messages and one-model state keys (the cards' model, their distinct
    models joined by "+" on a node mixing models, the node's model when it has no card), and
    whether the row mixes models."""
    if not card_models:
        return node_model, False
    first = card_models[0]
    if card_models.count(first) == len(card_models):  # one model: the common case, in C
        return first, False
    return "+".join(sorted(set(card_models))), True
