"""Why a pod does not fit, for many nodes at once.

kube-scheduler wants a reason for every node the extender rejects, and on a busy cluster that
is most of them; asking :meth:`PlacementEngine.explain` node by node costs ~20 µs each, too
slow for a 5 ms filter on 1,000+ nodes. This module computes the same first failing check for
a whole array of rows with the engine's public arrays and formats only the strings. Its wording
and order are the engine's, and a test holds it equal to ``explain`` on random states.

``NodeFacts`` adds what never changes with usage (is there an inventory, how many healthy
cards, the biggest card, the models), so "can never fit here" is told apart from "does not fit
now": kube-scheduler may preempt for the second, never for the first. On a node mixing card
models, a pod restricted to models counts only the healthy cards of those models.

Formatting thousands of strings per filter is itself most of a 5 ms budget, so both kinds of
reason are remembered: structural ones per request shape until a node's facts change,
usage ones per (pod shape, row) until the row is rewritten (:class:`ReasonCache`). Tests hold
the remembered reasons equal to fresh ones while nodes change.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kubegpu.core.names import model_key
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.sharing.accounting import NodeInfo
from kubegpu.sharing.annotations import INVENTORY_ANNOTATION
from kubegpu.sharing.resources import GpuRequest, RequestKind

IntArray = npt.NDArray[np.int64]

# The rejections metric's label of each first failing check, for counting without reading the
# strings (kubegpu_extender_node_rejections_total; reason_category gives the same for one
# string). Explain codes index EXPLAIN_CATEGORIES, structural codes STRUCTURAL_CATEGORIES.
EXPLAIN_CATEGORIES = (
    "cpu",
    "memory",
    "other",  # a CPU-only pod that fits: never asked for (kept for explain's order)
    "no-gpu",
    "gpu-model",
    "whole-gpus",
    "gpu-compute",
    "gpu-memory",
    "other",  # fits after all
)
STRUCTURAL_CATEGORIES = ("no-inventory", "gpu-model", "whole-gpus", "gpu-memory")
_STRUCTURAL_CACHE_SHAPES = 64
_StructuralKey = tuple[frozenset[str], RequestKind, int, int]


@dataclass(frozen=True)
class ModelFacts:
    """Per engine row, what a set of allowed models leaves of the healthy cards."""

    allowed: npt.NDArray[np.bool_]  # some healthy card is an allowed model
    healthy: IntArray  # healthy cards of an allowed model
    biggest_mib: IntArray  # memory of the biggest of them


@dataclass
class NodeFacts:
    """Per engine row, what does not depend on usage."""

    missing: list[str]  # why the node has no usable inventory ("" when it has one)
    healthy: IntArray  # healthy cards
    biggest_mib: IntArray  # memory of the biggest healthy card
    models: list[frozenset[str]]  # models of healthy cards
    missing_flags: npt.NDArray[np.bool_]  # missing[i] != ""
    # Rows whose healthy cards mix models: each healthy card's (model, memory MiB).
    mixed_cards: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    _model_facts: dict[frozenset[str], ModelFacts] = field(default_factory=dict)
    # Per request shape, each row's structural reason once computed (None: not yet). The
    # reasons change only with the facts, so update() drops them all.
    _reasons: OrderedDict[_StructuralKey, list[str | None]] = field(default_factory=OrderedDict)

    def for_models(self, models: frozenset[str]) -> ModelFacts:
        """The healthy cards ``models`` allows, per row (cached until the facts change)."""
        found = self._model_facts.get(models)
        if found is None:
            allowed = np.array([bool(m & models) for m in self.models], dtype=bool)
            healthy = np.where(allowed, self.healthy, 0)
            biggest = np.where(allowed, self.biggest_mib, 0)
            for row, cards in self.mixed_cards.items():
                memories = [mib for model, mib in cards if model in models]
                healthy[row] = len(memories)
                biggest[row] = max(memories, default=0)
            found = ModelFacts(allowed, healthy, biggest)
            self._model_facts[models] = found
        return found

    def capacity(self, request: GpuRequest) -> tuple[IntArray, IntArray]:
        """(healthy cards, biggest card MiB) per row that the request may use."""
        if request.gpu_models:
            facts = self.for_models(request.gpu_models)
            return facts.healthy, facts.biggest_mib
        return self.healthy, self.biggest_mib

    def never_fits(self, rows: IntArray, request: GpuRequest) -> npt.NDArray[np.bool_]:
        """Per row: does :func:`structural` give a reason? (vectorised pre-check)"""
        mask: npt.NDArray[np.bool_] = self.missing_flags[rows].copy()
        if request.gpu_models:
            mask |= ~self.for_models(request.gpu_models).allowed[rows]
        healthy, biggest = self.capacity(request)
        if request.kind is RequestKind.WHOLE:
            mask |= healthy[rows] < request.whole_gpus
        elif request.kind is RequestKind.SHARED:
            mask |= biggest[rows] < request.gpu_memory_mib
        return mask

    def structural_codes(self, rows: IntArray, request: GpuRequest) -> IntArray:
        """Per row (all with a structural reason): which check of :func:`structural` fails,
        as an index into :data:`STRUCTURAL_CATEGORIES`."""
        model_bad = (
            ~self.for_models(request.gpu_models).allowed[rows]
            if request.gpu_models
            else np.zeros(rows.size, dtype=bool)
        )
        whole_bad = (
            self.capacity(request)[0][rows] < request.whole_gpus
            if request.kind is RequestKind.WHOLE
            else np.zeros(rows.size, dtype=bool)
        )
        codes: IntArray = np.select(
            [self.missing_flags[rows], model_bad, whole_bad], [0, 1, 2], default=3
        ).astype(np.int64)
        return codes

    def structural_reasons(
        self, rows: IntArray, names: Sequence[str], request: GpuRequest
    ) -> list[str]:
        """:func:`structural` of each (row, name) pair, remembered per request shape (the same
        few shapes come again and again; formatting hundreds of strings each time does not
        fit a 5 ms filter). ``names`` must be the rows' engine names."""
        key = (request.gpu_models, request.kind, request.whole_gpus, request.gpu_memory_mib)
        cached = self._reasons.get(key)
        if cached is None:
            cached = [None] * len(self.missing)
            self._reasons[key] = cached
            if len(self._reasons) > _STRUCTURAL_CACHE_SHAPES:
                self._reasons.popitem(last=False)
        else:
            self._reasons.move_to_end(key)
        positions = rows.tolist()
        if not positions:
            return []
        found = (
            list(operator.itemgetter(*positions)(cached))
            if len(positions) > 1
            else [cached[positions[0]]]
        )
        if None in found:
            for k, (row, name) in enumerate(zip(positions, names, strict=True)):
                if found[k] is None:
                    reason = structural(self, row, name, request)
                    cached[row] = reason
                    found[k] = reason
        return found  # no None left

    @classmethod
    def build(cls, engine: PlacementEngine, nodes: Mapping[str, NodeInfo]) -> NodeFacts:
        n = len(engine.names)
        facts = cls(
            [""] * n,
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            [frozenset()] * n,
            np.zeros(n, dtype=bool),
        )
        for row, name in enumerate(engine.names):
            facts.update(row, name, nodes.get(name))
        return facts

    def update(self, row: int, name: str, info: NodeInfo | None) -> None:
        """Refresh one row after its node changed (health, allocatable, inventory)."""
        inventory = info.inventory if info is not None else None
        if inventory is None:
            error = info.inventory_error if info is not None else ""
            missing = (
                f"{name}: GPU inventory unreadable ({error})"
                if error
                else f"{name}: no GPU inventory published (annotation "
                f"{INVENTORY_ANNOTATION} missing: is the kubegpu node agent running there?)"
            )
            healthy, biggest, models = 0, 0, frozenset[str]()
            cards: tuple[tuple[str, int], ...] | None = None
        else:
            good = [g for g in inventory.gpus if g.healthy]
            missing = ""
            healthy = len(good)
            biggest = max((g.memory_mib for g in good), default=0)
            # In the spelling the pod's model list was parsed into (sharing.resources).
            models = frozenset(model_key(g.model) for g in good)
            cards = (
                tuple((model_key(g.model), g.memory_mib) for g in good) if len(models) > 1 else None
            )
        if (missing, healthy, biggest, models, cards) == (
            self.missing[row],
            int(self.healthy[row]),
            int(self.biggest_mib[row]),
            self.models[row],
            self.mixed_cards.get(row),
        ):
            return  # usage changed, not the facts: the cached masks and reasons still hold
        self._model_facts.clear()
        self._reasons.clear()
        self.missing[row] = missing
        self.healthy[row] = healthy
        self.biggest_mib[row] = biggest
        self.models[row] = models
        self.missing_flags[row] = bool(missing)
        if cards is None:
            self.mixed_cards.pop(row, None)
        else:
            self.mixed_cards[row] = cards


def structural(facts: NodeFacts, row: int, name: str, request: GpuRequest) -> str:
    """Why ``name`` can never take the pod, whatever is freed ("" if it might)."""
    if facts.missing[row]:
        return facts.missing[row]
    allowed = ",".join(sorted(request.gpu_models))
    if request.gpu_models and not facts.models[row] & request.gpu_models:
        have = ",".join(sorted(facts.models[row])) or "none healthy"
        return f"{name}: GPU models {have}, pod allows {allowed}"
    healthy, biggest = (int(a[row]) for a in facts.capacity(request))
    # Name the model only where the node has healthy cards of others that do not count.
    of_model = (
        f" of model {allowed}"
        if request.gpu_models and facts.models[row] - request.gpu_models
        else ""
    )
    if request.kind is RequestKind.WHOLE and healthy < request.whole_gpus:
        return (
            f"{name}: has {healthy} healthy GPUs{of_model}, pod needs "
            f"{request.whole_gpus} whole GPUs"
        )
    if request.kind is RequestKind.SHARED and biggest < request.gpu_memory_mib:
        return (
            f"{name}: largest card{of_model} has {biggest} MiB in total, pod needs "
            f"{request.gpu_memory_mib} MiB"
        )
    return ""


def explain_rows(engine: PlacementEngine, pod: PodRequest, rows: IntArray) -> list[str]:
    """``engine.explain(name, pod).reason`` for each of ``rows`` (all infeasible), vectorised."""
    return explain_rows_coded(engine, pod, rows)[0]


def explain_rows_coded(
    engine: PlacementEngine, pod: PodRequest, rows: IntArray
) -> tuple[list[str], IntArray]:
    """:func:`explain_rows`, plus per row which check failed (an index into
    :data:`EXPLAIN_CATEGORIES`; 2 and 8 go with an empty reason)."""
    if rows.size == 0:
        return [], np.zeros(0, dtype=np.int64)
    names = engine.names
    cpu = engine.cpu_free[rows]
    memory = engine.memory_free[rows]
    cpu_short = cpu < pod.cpu_milli
    memory_short = memory < pod.memory_mib
    count = engine.gpu_count[rows]
    free = engine.card_compute[rows]
    valid = np.arange(free.shape[1])[None, :] < count[:, None]
    if pod.gpu_milli >= MILLI_PER_GPU:
        whole = ((free == MILLI_PER_GPU) & valid).sum(axis=1)
        largest = np.zeros(rows.size, dtype=np.int64)
        best_memory = largest
    else:
        whole = np.zeros(rows.size, dtype=np.int64)
        largest = (
            np.where(valid, free, -1).max(axis=1)
            if free.size
            else np.zeros(rows.size, dtype=np.int64)
        )
        if pod.gpu_memory_mib is not None:
            enough = (free >= pod.gpu_milli) & valid
            best_memory = np.where(enough, engine.card_memory[rows], -1).max(axis=1)
        else:
            best_memory = np.zeros(rows.size, dtype=np.int64)
    # The first failing check, in explain's order: assigned from the last check to the first
    # so that earlier checks win (np.select does the same, at several times the cost).
    codes = np.full(rows.size, 7 if pod.gpu_memory_mib is not None else 8, dtype=np.int64)
    codes[largest < pod.gpu_milli] = 6
    if pod.gpu_milli >= MILLI_PER_GPU:
        codes[:] = 5
    # Nodes mixing models with only some cards allowed: the engine checks those cards itself
    # (few nodes mix models, so its per-row explain costs little here).
    by_engine: npt.NDArray[np.bool_] | None = None
    if pod.gpu_models:
        selection = engine.model_selection(pod.gpu_models)
        codes[~selection.rows[rows]] = 4
        if selection.partial.size and pod.gpu_count:
            by_engine = np.isin(rows, selection.partial)
            if not by_engine.any():
                by_engine = None
    codes[count == 0] = 3
    if pod.gpu_count == 0:
        codes[:] = 2
    codes[memory_short] = 1
    codes[cpu_short] = 0
    engine_reasons: dict[int, str] = {}
    if by_engine is not None:
        for k in np.flatnonzero(by_engine).tolist():
            codes[k], engine_reasons[k] = engine.explain_row(int(rows[k]), pod)
        ours = ~by_engine
    # The strings are the point, so one f-string per row is unavoidable; but the branch is
    # decided above, so each kind of reason is formatted by its own comprehension over just
    # its rows (no per-row branching or indexing), then put back in row order.
    row_list = rows.tolist()
    picked = operator.itemgetter(*row_list)(names) if len(row_list) > 1 else (names[row_list[0]],)
    row_names = np.empty(rows.size, dtype=object)
    row_names[:] = picked
    out = np.full(rows.size, "", dtype=object)
    for code in np.unique(codes if by_engine is None else codes[ours]).tolist():
        where = np.flatnonzero(codes == code if by_engine is None else (codes == code) & ours)
        who = row_names[where].tolist()
        if code == 0:
            tail = f" milli-CPU free, pod needs {pod.cpu_milli}"
            out[where] = [f"{n}: {v}{tail}" for n, v in zip(who, cpu[where].tolist(), strict=True)]
        elif code == 1:
            tail = f" MiB memory free, pod needs {pod.memory_mib}"
            out[where] = [
                f"{n}: {v}{tail}" for n, v in zip(who, memory[where].tolist(), strict=True)
            ]
        elif code == 3:
            out[where] = [f"{n}: has no GPU" for n in who]
        elif code == 4:
            allowed = "|".join(sorted(pod.gpu_models))
            models = [
                ("models " if engine.mixed[i] else "model ") + engine.models[i]
                for i in rows[where].tolist()
            ]
            out[where] = [
                f"{n}: GPU {m}, pod allows {allowed}" for n, m in zip(who, models, strict=True)
            ]
        elif code == 5:
            head = f": needs {pod.gpu_count} whole GPUs, "
            out[where] = [
                f"{n}{head}{v} free" for n, v in zip(who, whole[where].tolist(), strict=True)
            ]
        elif code == 6:
            tail = f" milli, pod needs {pod.gpu_milli}"
            out[where] = [
                f"{n}: largest free card share is {v}{tail}"
                for n, v in zip(who, largest[where].tolist(), strict=True)
            ]
        elif code == 7:
            tail = f" MiB, pod needs {pod.gpu_memory_mib} MiB"
            out[where] = [
                f"{n}: largest free card has {v}{tail}"
                for n, v in zip(who, best_memory[where].tolist(), strict=True)
            ]
    for k, reason in engine_reasons.items():
        out[k] = reason
    reasons: list[str] = out.tolist()
    return reasons, codes


_PodShape = tuple[int, int, int, int, int | None, frozenset[str]]


class ReasonCache:
    """:func:`explain_rows_coded` remembered per (pod shape, row) while the row is unchanged.

    A row's reason depends only on its free resources and the pod's shape, and between two
    decisions a bind changes one node; pods come in replica sets of one shape. The caller
    keeps ``versions`` (one counter per engine row, bumped whenever the row is rewritten) and
    drops the cache when the engine is rebuilt.
    """

    def __init__(self, rows: int, shapes: int = 32) -> None:
        self.rows = rows
        self.shapes = shapes
        # Per shape: reasons (object), codes (-1: not computed), row version when computed.
        self._entries: OrderedDict[
            _PodShape, tuple[npt.NDArray[np.object_], IntArray, IntArray]
        ] = OrderedDict()

    def explain(
        self, engine: PlacementEngine, pod: PodRequest, rows: IntArray, versions: IntArray
    ) -> tuple[list[str], IntArray]:
        """What :func:`explain_rows_coded` gives for ``rows`` (all infeasible) now."""
        shape = (
            pod.cpu_milli,
            pod.memory_mib,
            pod.gpu_count,
            pod.gpu_milli,
            pod.gpu_memory_mib,
            pod.gpu_models,
        )
        entry = self._entries.get(shape)
        if entry is None:
            entry = (
                np.full(self.rows, "", dtype=object),
                np.full(self.rows, -1, dtype=np.int64),
                np.zeros(self.rows, dtype=np.int64),
            )
            self._entries[shape] = entry
            if len(self._entries) > self.shapes:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(shape)
        reasons, codes, seen = entry
        stale = rows[(codes[rows] < 0) | (seen[rows] != versions[rows])]
        if stale.size:
            fresh, fresh_codes = explain_rows_coded(engine, pod, stale)
            reasons[stale] = fresh
            codes[stale] = fresh_codes
            seen[stale] = versions[stale]
        out: list[str] = reasons[rows].tolist()
        return out, codes[rows]


def rows_of(engine_rows: Mapping[str, int], names: Sequence[str]) -> IntArray:
    return np.fromiter((engine_rows.get(n, -1) for n in names), dtype=np.int64, count=len(names))
