"""Why a pod does not fit, for many nodes at once.

kube-scheduler wants a reason for every node the extender rejects, and on a busy cluster that
is most of them. It counts identical reasons into one line of the pod's ``PodScheduled``
condition and its ``FailedScheduling`` event ("0/1213 nodes are available: 900 node(s) have no
card with 10240 MiB of GPU memory free, 313 ..."), as it does for its own plugins' reasons. So
the filter's reasons name the failing check and the pod's ask, never the node or the node's
own figures: one reason per node naming both would make that message one entry per node
(6.5 KB at 100 nodes on the real kube-scheduler, ~300 KB at 5,000, written into the pod's
status on every attempt) and cost a formatted string per node per filter.

Which check fails first is the engine's (:meth:`PlacementEngine.explain_row`), computed here for
a whole array of rows with the engine's public arrays (:func:`explain_codes`); a test holds it
equal to the engine's. A single node's reason naming its figures (the bind path, ``kubectl gpu``
and the simulator) is still :meth:`PlacementEngine.explain`'s.

``NodeFacts`` adds what never changes with usage (is there an inventory, how many healthy
cards, the biggest card, the models), so "can never fit here" is told apart from "does not fit
now": kube-scheduler may preempt for the second, never for the first. On a node mixing card
models, a pod restricted to models counts only the healthy cards of those models.
"""

from __future__ import annotations

from collections import Counter
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
# Structural code 4 is an inventory that is published but unreadable (metric label as 0).
STRUCTURAL_CATEGORIES = ("no-inventory", "gpu-model", "whole-gpus", "gpu-memory", "no-inventory")
# A node the extender's node watch has not delivered yet (the metric's "unknown-node").
UNSEEN_NODE = "node(s) not yet seen by the kubegpu extender's node watch"


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
    unreadable_flags: npt.NDArray[np.bool_]  # an inventory is published but unreadable
    # Rows whose healthy cards mix models: each healthy card's (model, memory MiB).
    mixed_cards: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    _model_facts: dict[frozenset[str], ModelFacts] = field(default_factory=dict)

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
        as an index into :data:`STRUCTURAL_CATEGORIES` and :func:`structural_phrases`."""
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
            [self.unreadable_flags[rows], self.missing_flags[rows], model_bad, whole_bad],
            [4, 0, 1, 2],
            default=3,
        ).astype(np.int64)
        return codes

    @classmethod
    def build(cls, engine: PlacementEngine, nodes: Mapping[str, NodeInfo]) -> NodeFacts:
        n = len(engine.names)
        facts = cls(
            [""] * n,
            np.zeros(n, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            [frozenset()] * n,
            np.zeros(n, dtype=bool),
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
            return  # usage changed, not the facts: the cached masks still hold
        self._model_facts.clear()
        self.missing[row] = missing
        self.healthy[row] = healthy
        self.biggest_mib[row] = biggest
        self.models[row] = models
        self.missing_flags[row] = bool(missing)
        self.unreadable_flags[row] = (
            bool(missing) and info is not None and bool(info.inventory_error)
        )
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


def structural_phrases(request: GpuRequest) -> tuple[str, ...]:
    """The filter's reason for each :meth:`NodeFacts.structural_codes` code: the check and
    the pod's ask, the same words on every node (see the module's docstring)."""
    allowed = ",".join(sorted(request.gpu_models))
    of_model = f" of model {allowed}" if request.gpu_models else ""
    return (
        f"node(s) have no GPU inventory published (annotation {INVENTORY_ANNOTATION} missing: "
        "is the kubegpu node agent running there?)",
        f"node(s) have no healthy GPU of model {allowed}",
        f"node(s) have fewer than {request.whole_gpus} healthy GPUs{of_model}",
        f"node(s) have no card{of_model} with {request.gpu_memory_mib} MiB of GPU memory in total",
        f"node(s) have an unreadable GPU inventory (annotation {INVENTORY_ANNOTATION}; "
        "kubectl gpu inspect and the extender's log name the error)",
    )


def refusal_phrases(pod: PodRequest) -> tuple[str, ...]:
    """The filter's reason for each :func:`explain_codes` code (:data:`EXPLAIN_CATEGORIES`),
    in the engine's terms but naming only the pod's ask, the same words on every node. Models
    are listed as in ``kubegpu.io/gpu-models`` and :func:`structural_phrases`, comma-separated."""
    allowed = ",".join(sorted(pod.gpu_models))
    # With a model list only the cards of those models count (on mixed nodes too).
    of_model = f" of model {allowed}" if pod.gpu_models else ""
    # A share asking memory alone holds a token milli of compute: name what it asked.
    memory = (
        f"node(s) have no card{of_model} with {pod.gpu_milli} milli of GPU compute and "
        f"{pod.gpu_memory_mib} MiB of GPU memory free"
        if pod.gpu_milli > 1
        else f"node(s) have no card{of_model} with {pod.gpu_memory_mib} MiB of GPU memory free"
    )
    does_not_fit = "node(s) do not fit the pod"
    return (
        f"node(s) have less than {pod.cpu_milli} milli-CPU free",
        f"node(s) have less than {pod.memory_mib} MiB of memory free",
        does_not_fit,  # a pod asking no GPU that fits: not asked for
        "node(s) have no GPU",
        f"node(s) have no GPU of model {allowed}",
        f"node(s) have fewer than {pod.gpu_count} whole GPUs{of_model} free",
        f"node(s) have no card{of_model} with {pod.gpu_milli} milli of GPU compute free",
        memory,
        does_not_fit,  # fits after all (the state moved between checks)
    )


def phrases_of(phrases: Sequence[str], codes: IntArray) -> list[str]:
    """``[phrases[c] for c in codes]``, picked in C (thousands of rejected nodes)."""
    table = np.empty(len(phrases), dtype=object)
    table[:] = phrases
    picked: list[str] = table[codes].tolist()
    return picked


def reason_counts(*by_node: Mapping[str, str]) -> str:
    """The rejections as kube-scheduler words them in the pod's event: each reason once with
    its count, as sorted strings ("313 node(s) have ..., 900 node(s) have ...")."""
    counts = Counter(reason for reasons in by_node for reason in reasons.values())
    return ", ".join(sorted(f"{n} {reason}" for reason, n in counts.items()))


def explain_codes(engine: PlacementEngine, pod: PodRequest, rows: IntArray) -> IntArray:
    """``engine.explain_row(row, pod)[0]`` for each of ``rows`` (all infeasible), vectorised:
    the first failing check, an index into :data:`EXPLAIN_CATEGORIES`."""
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64)
    cpu_short = engine.cpu_free[rows] < pod.cpu_milli
    memory_short = engine.memory_free[rows] < pod.memory_mib
    count = engine.gpu_count[rows]
    # The first failing check, in explain's order: assigned from the last check to the first
    # so that earlier checks win (np.select does the same, at several times the cost).
    codes = np.full(rows.size, 7 if pod.gpu_memory_mib is not None else 8, dtype=np.int64)
    if pod.gpu_milli >= MILLI_PER_GPU:
        codes[:] = 5
    else:
        free = engine.card_compute[rows]
        if free.size:
            valid = np.arange(free.shape[1])[None, :] < count[:, None]
            codes[np.where(valid, free, -1).max(axis=1) < pod.gpu_milli] = 6
        else:
            codes[:] = 6
    # Nodes mixing models with only some cards allowed: the engine checks those cards itself
    # (few nodes mix models, so its per-row explain costs little here).
    by_engine: IntArray | None = None
    if pod.gpu_models:
        selection = engine.model_selection(pod.gpu_models)
        codes[~selection.rows[rows]] = 4
        if selection.partial.size and pod.gpu_count:
            by_engine = np.flatnonzero(np.isin(rows, selection.partial))
    codes[count == 0] = 3
    if pod.gpu_count == 0:
        codes[:] = 2
    codes[memory_short] = 1
    codes[cpu_short] = 0
    if by_engine is not None:
        for k in by_engine.tolist():
            codes[k] = engine.explain_row(int(rows[k]), pod)[0]
    return codes


def rows_of(engine_rows: Mapping[str, int], names: Sequence[str]) -> IntArray:
    return np.fromiter((engine_rows.get(n, -1) for n in names), dtype=np.int64, count=len(names))
