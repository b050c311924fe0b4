"""FGD (Weng et al., ATC'23): score a node by how little its fragmentation grows, and give a
share the card whose use grows it least.

A node's FGD score depends only on its fragmentation state (free CPU, free milli per card,
model) and the pod's class, so :class:`FgdScorer` keeps, per pod class, a table from the
state's id (:attr:`ClusterState.state_id`) to its score, computed once per state. The
registry's entry takes :func:`node_scorer`, :data:`CARDS` and :func:`target` from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kubegpu.placement.feasibility import eligible_cards
from kubegpu.placement.fragmentation import (
    ClassKey,
    FragmentationMemo,
    TypicalWorkload,
    sigmoid_score,
    whole_card_sorted_after,
)
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policies.cards import lowest_full_cards
from kubegpu.placement.policy import (
    CardChooser,
    CardRule,
    NodeScorer,
    PolicyInputs,
    ScoredNodes,
)
from kubegpu.placement.state import ClusterState, IntArray, StateKey

# FGD keeps the most popular classes covering this share of the pods (spec §6).
POPULARITY_PERCENT = 95.0

# A pod's class as the per-state tables key it.
PodKey = tuple[int, int, int, frozenset[str]]
# A pod's GPU shape (per-card milli, card count, models): a value keyed by CPU level reads the
# pod's CPU only through the level after it lands, so pod classes of one shape share it.
ShapeKey = tuple[int, int, frozenset[str]]


def pod_key(pod: PodRequest) -> PodKey:
    return (pod.cpu_milli, pod.gpu_milli, pod.gpu_count, pod.gpu_models)


def shape_key(pod: PodRequest) -> ShapeKey:
    return (pod.gpu_milli, pod.gpu_count, pod.gpu_models)


# A node state as a value keyed by CPU level reads it: (level of its free CPU, level of its
# free CPU less the pod's, free milli, model).
LevelledKey = tuple[int, int, tuple[int, ...], Any]


def fill_from_levelled(
    sids: Iterable[int],
    state_keys: Sequence[tuple[int, tuple[int, ...], Any]],
    pod_cpu_milli: int,
    level: Callable[[int], int],
    levelled: Mapping[LevelledKey, Any],
    table: Any,
) -> list[tuple[int, LevelledKey]]:
    """For a value that reads a node's free CPU only through the fragments before and after a
    pod of ``pod_cpu_milli`` lands (FGD's score, a CPU-only pod's growth): set
    ``table[sid]`` for each state of ``sids`` whose (level before, level after, free milli,
    model) is in ``levelled``, a state met before under another free CPU of the same levels,
    and return the others with their key, to compute."""
    todo: list[tuple[int, LevelledKey]] = []
    for sid in sids:
        cpu, free, model = state_keys[sid]
        coarse = (level(cpu), level(cpu - pod_cpu_milli), free, model)
        known = levelled.get(coarse)
        if known is None:
            todo.append((sid, coarse))
        else:
            table[sid] = known
    return todo


class FgdScorer(ScoredNodes):
    """FGD's node score and card choice over ``state``; ``memo`` measures fragmentation
    against the target workload."""

    def __init__(self, state: ClusterState, memo: FragmentationMemo) -> None:
        self.state = state
        self.memo = memo
        self._score_tables: dict[PodKey, npt.NDArray[np.int16]] = {}
        # Per pod shape, with memos keyed by CPU level: score per (level before, level
        # after, free milli, model) (see _fill). Keyed by shape, not class: classes of one
        # shape asking different CPU meet the same (before, after) levels on many states.
        self._levelled: dict[ShapeKey, dict[LevelledKey, int]] = {}

    def state_score(self, key: StateKey, pod: PodRequest) -> int:
        """FGD score of a node in state ``key`` for ``pod`` (best card for a share)."""
        cpu, free, model = key
        cpu_after = cpu - pod.cpu_milli
        if not pod.is_gpu_share:
            after = (
                mixed_whole_after(free, model, pod)
                if isinstance(model, tuple)
                else whole_card_sorted_after(free, pod.gpu_count)
            )
            before_whole = self.memo.fragment(cpu, free, model)
            return sigmoid_score(before_whole, self.memo.fragment(cpu_after, after, model))
        before = self.memo.fragment(cpu, free, model)
        best = -1
        if isinstance(model, tuple):
            for _, after in mixed_share_options(free, model, pod):
                best = max(best, sigmoid_score(before, self.memo.fragment(cpu_after, after, model)))
            return best
        previous = -1
        for pos, value in enumerate(free):
            if value < pod.gpu_milli or value == previous:
                continue
            previous = value
            after = replace_sorted(free, pos, value - pod.gpu_milli)
            best = max(best, sigmoid_score(before, self.memo.fragment(cpu_after, after, model)))
        return best

    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        """FGD's integer score of each of ``rows`` (all feasible)."""
        state = self.state
        if pod.gpu_memory_mib is not None:
            # Card memory makes card eligibility row-specific: no shared cache.
            return np.array([self.row_choice(int(i), pod)[0] for i in rows], dtype=np.int64)
        return self.scores_of_states(pod, state.state_id[rows]).astype(np.int64)

    def scores_of_states(self, pod: PodRequest, ids: IntArray) -> npt.NDArray[np.int16]:
        """FGD's score of each node state ``ids`` (state ids, repeats allowed) for a pod
        whose card memory does not matter, in the table's own dtype, the missing ones
        computed first (one reduction finds them)."""
        key = pod_key(pod)
        table = self._score_table(key)
        out = table[ids]
        if out.size and out.min() < 0:
            self._fill(pod, key, table, ids[out < 0])
            out = table[ids]
        return out

    def score_of_state(self, pod: PodRequest, sid: int) -> int:
        """:meth:`scores_of_states` of one node state."""
        key = pod_key(pod)
        table = self._score_table(key)
        score = int(table[sid])
        if score < 0:
            self._fill(pod, key, table, np.array([sid]))
            score = int(table[sid])
        return score

    def _score_table(self, key: PodKey) -> npt.NDArray[np.int16]:
        """Pod class ``key``'s score per node state (-1: not computed yet), grown (doubling)
        to hold every state seen so far."""
        table = self._score_tables.get(key)
        needed = len(self.state.state_keys)
        if table is None or table.size < needed:
            grown = np.full(max(needed * 2, 1024), -1, dtype=np.int16)
            if table is not None:
                grown[: table.size] = table
            table = grown
            self._score_tables[key] = table
        return table

    def _fill(
        self, pod: PodRequest, key: PodKey, table: npt.NDArray[np.int16], ids: IntArray
    ) -> None:
        """Score the node states ``ids`` (some repeated) into ``table``."""
        state = self.state
        memo = self.memo
        if not memo.cpu_levels:
            sids = sorted(set(ids.tolist()))  # few: cheaper than np.unique
            self.prefetch_states(pod, [state.state_keys[sid] for sid in sids])
            for sid in sids:
                table[sid] = self.state_score(state.state_keys[sid], pod)
            return
        # A memo keyed by CPU level: the score reads the free CPU only through the fragments
        # before (free CPU) and after (free CPU − the pod's), so it is one value per (level
        # before, level after, free milli, model).
        levelled = self._levelled.setdefault(shape_key(pod), {})
        todo = fill_from_levelled(
            dict.fromkeys(ids.tolist()),  # distinct; the order does not matter
            state.state_keys,
            pod.cpu_milli,
            memo.cpu_key,
            levelled,
            table,
        )
        if not todo:
            return
        plain = [(sid, coarse) for sid, coarse in todo if isinstance(coarse[3], str)]
        for (sid, coarse), (before, afters) in zip(
            plain, self.fragments_at_levels(pod, [coarse for _, coarse in plain]), strict=True
        ):
            best = -1
            for after in afters:
                best = max(best, sigmoid_score(before, after))
            table[sid] = best
            levelled[coarse] = best
        for sid, coarse in todo:
            if not isinstance(coarse[3], str):  # a node mixing models: as FGD scores it
                score = self.state_score(state.state_keys[sid], pod)
                table[sid] = score
                levelled[coarse] = score

    def fragments_at_levels(
        self, pod: PodRequest, keys: Sequence[LevelledKey]
    ) -> list[tuple[float, list[float]]]:
        """For nodes of one model, each given as (level before, level after, free milli,
        model) in the memo's CPU levels: the fragment before ``pod`` lands, and after it
        on each option :meth:`state_score` weighs (each distinct card a share fits; the
        whole cards taken; a CPU-only pod's free milli as they are), all fragments missing
        from the memo computed in one batch. :meth:`state_score`'s values, its after-states
        made once instead of once for the batch and once for the score."""
        memo = self.memo
        wanted: list[tuple[int, tuple[int, ...], str]] = []
        options: list[list[tuple[int, ...]]] = []
        milli = pod.gpu_milli
        for before_level, after_level, free, model in keys:
            assert isinstance(model, str)
            if not pod.gpu_count:
                after = [free]
            elif not pod.is_gpu_share:
                after = [whole_card_sorted_after(free, pod.gpu_count)]
            else:
                after = []
                previous = -1
                for pos, value in enumerate(free):
                    if value < milli or value == previous:
                        continue
                    previous = value
                    after.append(replace_sorted(free, pos, value - milli))
            options.append(after)
            wanted.append((before_level, free, model))
            wanted.extend((after_level, a, model) for a in after)
        memo.prefetch_at_keys(wanted)
        fragment = memo.fragment_at_key
        out: list[tuple[float, list[float]]] = []
        for (before_level, after_level, free, model), after in zip(keys, options, strict=True):
            out.append(
                (
                    fragment(before_level, free, model),
                    [fragment(after_level, a, model) for a in after],
                )
            )
        return out

    def prefetch_states(self, pod: PodRequest, keys: list[StateKey]) -> None:
        """Batch-compute the fragments :meth:`state_score` will look up for ``keys``
        (single-model states; a node mixing models is computed when looked up)."""
        memo = self.memo
        wanted: list[tuple[int, tuple[int, ...], str]] = []
        for cpu, free, model in keys:
            if not isinstance(model, str):
                continue
            wanted.append((cpu, free, model))
            cpu_after = cpu - pod.cpu_milli
            if not pod.gpu_count:
                wanted.append((cpu_after, free, model))
            elif not pod.is_gpu_share:
                wanted.append((cpu_after, whole_card_sorted_after(free, pod.gpu_count), model))
            else:
                previous = -1
                for pos, value in enumerate(free):
                    if value < pod.gpu_milli or value == previous:
                        continue
                    previous = value
                    after = replace_sorted(free, pos, value - pod.gpu_milli)
                    wanted.append((cpu_after, after, model))
        memo.prefetch(wanted)

    def row_choice(self, i: int, pod: PodRequest) -> tuple[int, tuple[int, ...]]:
        """FGD score of row ``i`` and the card columns it would use (first best card)."""
        state = self.state
        if not pod.is_gpu_share:
            return self.state_score(state.row_key(i), pod), lowest_full_cards(state, i, pod)
        count = int(state.gpu_count[i])
        free_cols = state.card_free[i, :count].tolist()
        cpu = int(state.cpu_free[i])
        eligible = eligible_cards(state, np.array([i]), pod)[0]
        best_score, best_col = -1, -1
        if state.mixed[i]:
            models = state.card_models[i]
            before = self.memo.fragment(cpu, tuple(free_cols), models)
            for col, after in mixed_share_options(tuple(free_cols), models, pod, eligible):
                after_fragment = self.memo.fragment(cpu - pod.cpu_milli, after, models)
                score = sigmoid_score(before, after_fragment)
                if score > best_score:  # options come in column order: lowest index on ties
                    best_score, best_col = score, col
            return best_score, (best_col,)
        sorted_free = tuple(sorted(free_cols))
        model = state.models[i]
        before = self.memo.fragment(cpu, sorted_free, model)
        by_value: dict[int, int] = {}
        for col in range(count):
            if not eligible[col]:
                continue
            value = free_cols[col]
            known = by_value.get(value)
            if known is None:
                pos = sorted_free.index(value)
                after = replace_sorted(sorted_free, pos, value - pod.gpu_milli)
                known = sigmoid_score(before, self.memo.fragment(cpu - pod.cpu_milli, after, model))
                by_value[value] = known
            score = known
            if score > best_score:  # strictly greater: the lowest index wins ties
                best_score, best_col = score, col
        return best_score, (best_col,)


def target(classes: Sequence[ClassKey]) -> TypicalWorkload:
    """FGD's target workload: the classes covering :data:`POPULARITY_PERCENT` of the pods, a
    model constraint keyed as spelt (the paper's simulator does so; live pods come with one
    spelling)."""
    return TypicalWorkload.from_classes(classes, POPULARITY_PERCENT)


def fgd_scorer(inputs: PolicyInputs, workload: TypicalWorkload) -> FgdScorer:
    """FGD over the engine's state, measuring fragmentation against ``workload``.

    Its memo keys the free CPU by its level (:class:`FragmentationMemo`): the same values,
    computed less often. FGD gets it as ours does: a baseline kept slow on purpose would only
    flatter our policy's speed against it."""
    return FgdScorer(inputs.state, FragmentationMemo(workload, cpu_levels=True))


def node_scorer(inputs: PolicyInputs) -> FgdScorer:
    """The registry's FGD node scorer: against the whole target workload."""
    return fgd_scorer(inputs, required_workload(inputs))


def required_workload(inputs: PolicyInputs) -> TypicalWorkload:
    if inputs.workload is None:  # the engine refuses this first for a policy that says so
        raise ValueError("fragmentation is measured against a target workload; none given")
    return inputs.workload


class FragmentationCards:
    """FGD's card choice: the card whose use adds the least fragmentation."""

    def __init__(self, fgd: FgdScorer) -> None:
        self.fgd = fgd

    def choose(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        return self.fgd.row_choice(i, pod)[1]


def _fragmentation_cards(inputs: PolicyInputs, scorer: NodeScorer) -> CardChooser:
    # The node scorer's own tables where it is FGD's (it scored the node by the same choice).
    return FragmentationCards(scorer if isinstance(scorer, FgdScorer) else node_scorer(inputs))


CARDS = CardRule("fragmentation", _fragmentation_cards)


def mixed_share_options(
    free: tuple[int, ...],
    models: tuple[str, ...],
    pod: PodRequest,
    eligible: Sequence[bool] | npt.NDArray[np.bool_] | None = None,
) -> list[tuple[int, tuple[int, ...]]]:
    """On a node mixing models (``free`` and ``models`` in card order): (column, free milli
    after) for each card the share may take, the first of each (free milli, model) only, since
    equal cards leave equal states. ``eligible`` (per column) overrides the compute and model
    test when card memory matters too."""
    out: list[tuple[int, tuple[int, ...]]] = []
    seen: set[tuple[int, str]] = set()
    for col, (value, model) in enumerate(zip(free, models, strict=True)):
        usable = (
            value >= pod.gpu_milli and pod.allows_model(model)
            if eligible is None
            else eligible[col]
        )
        if not usable or (value, model) in seen:
            continue
        seen.add((value, model))
        after = list(free)
        after[col] = value - pod.gpu_milli
        out.append((col, tuple(after)))
    return out


def mixed_whole_after(
    free: tuple[int, ...], models: tuple[str, ...], pod: PodRequest
) -> tuple[int, ...]:
    """On a node mixing models: free milli per card after ``pod`` takes its whole cards, the
    lowest-index fully free ones of an allowed model (as :func:`.cards.lowest_full_cards`)."""
    after = list(free)
    left = pod.gpu_count
    for col, (value, model) in enumerate(zip(free, models, strict=True)):
        if left and value == MILLI_PER_GPU and pod.allows_model(model):
            after[col] = 0
            left -= 1
    return tuple(after)


def replace_sorted(values: tuple[int, ...], pos: int, new: int) -> tuple[int, ...]:
    """``values`` (sorted) with the element at ``pos`` lowered to ``new``, still sorted."""
    out = list(values)
    del out[pos]
    lo = 0
    while lo < len(out) and out[lo] < new:
        lo += 1
    out.insert(lo, new)
    return tuple(out)
