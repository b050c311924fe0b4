"""Ours: least doomed waste first, then a tie-break per kind of pod, then first fit (the
fixed node rank).

The waste a placement dooms is :mod:`kubegpu.placement.waste`'s. Ties on it are broken by the
best fit of the share's card (shares), FGD's score (whole cards; the score is
:class:`~kubegpu.placement.policies.fgd.FgdScorer`'s) or fragmentation growth (CPU-only pods),
see :meth:`KubegpuScorer.keys`. Every key is cached per node state and pod class, as FGD's
score is, so a replay computes each once. The registry's entry takes :func:`node_scorer`,
:data:`CARDS` and :func:`target` from here.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kubegpu.placement.feasibility import eligible_cards
from kubegpu.placement.fragmentation import (
    ClassKey,
    FragmentationMemo,
    TypicalWorkload,
    spec_models,
)
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policies.fgd import (
    FgdScorer,
    LevelledKey,
    ShapeKey,
    fgd_scorer,
    fill_from_levelled,
    required_workload,
    shape_key,
)
from kubegpu.placement.policy import CardChooser, CardRule, NodeScorer, PolicyInputs
from kubegpu.placement.state import ClusterState, FloatArray, IntArray, StateKey
from kubegpu.placement.waste import ModelWaste, WasteWeights, numpy_floor, numpy_round6

# Our policy breaks ties of CPU-only pods by fragmentation growth in buckets of this many
# milli-GPU (see KubegpuScorer.keys for why not the exact value).
GROWTH_BUCKET_MILLI = 300.0
# Fragmentation (FGD's score of whole-card pods, CPU-only pods' growth) is measured against the
# classes covering this share of the target workload, as FGD measures it.
POPULAR_PERCENT = 95.0
# Up to this many rows, a missing first key is priced one node at a time in Python floats
# (the same operations as the vectorised pricing, in the same order): numpy's fixed cost per
# call is most of the work on the one or two nodes whose state is new.
SCALAR_ROWS = 4
# A pod's first two keys in one number per node state and pod class, its *order value*, so
# that the simulator's choice is one argmin (:meth:`KubegpuScorer._best_by_order`):
# ``bucket × ORDER_STRIDE + remainder``. A share's remainder is its best card's free milli
# (0 … 1000); a whole-card pod's is ``100 − FGD's score``, a CPU-only pod's its growth bucket
# plus :data:`GROWTH_OFFSET`; either is −1 while not known (an *unscored* value sorts before
# every scored one of its bucket). Remainders stay within −1 … stride − 2, so buckets stay
# apart; a power of two divides exactly, and every value is a whole number, exact in float64.
ORDER_STRIDE = 2048.0
UNSCORED = ORDER_STRIDE - 1.0  # an unscored value's remainder modulo the stride
# Growth buckets are at most a node's free GPU milli over GROWTH_BUCKET_MILLI either way, so
# below this offset on any node of fewer than 300 cards.
GROWTH_OFFSET = 1024.0

# One sort key over rows, in the dtype it is kept in: buckets and growths are floats, FGD's
# score and free milli integers; every value is a whole number or ±inf, so comparisons are
# exact in any of them.
KeyArray = npt.NDArray[np.float32] | npt.NDArray[np.float64] | npt.NDArray[np.int64]

# A key stage and a pod class, as the per-state tables of our keys are keyed.
StageKey = tuple[str, int, int, int, frozenset[str]]


def _class_key(stage: str, pod: PodRequest) -> StageKey:
    return (stage, pod.cpu_milli, pod.gpu_milli, pod.gpu_count, pod.gpu_models)


class KubegpuScorer:
    """Our node order and card choice over ``state``.

    ``fgd`` scores shares against the whole target workload and whole-card pods against its
    :data:`POPULAR_PERCENT` classes; ``waste`` is the per-model waste the workload dooms.
    """

    def __init__(self, state: ClusterState, fgd: FgdScorer, waste: ModelWaste) -> None:
        self.state = state
        self.fgd = fgd
        self.waste = waste
        # Each row's entry in the per-model waste (nodes mixing models: the pooled one).
        self.waste_entry: IntArray = np.array(
            [
                waste.index("" if mixed else model)
                for model, mixed in zip(state.models, state.mixed, strict=True)
            ],
            dtype=np.int64,
        )
        self._entries: list[int] = self.waste_entry.tolist()  # the same, for Python floats
        # Per CPU-only pod shape: growth bucket per (level before, level after, free milli,
        # model) (see _growth_bucket), shared by CPU-only classes as FGD's levelled scores.
        self._levelled_growth: dict[ShapeKey, dict[LevelledKey, float]] = {}
        # Per pod class and stage: order value per node state (NaN: not priced yet).
        self._order_tables: dict[StageKey, FloatArray] = {}

    @property
    def memo(self) -> FragmentationMemo:
        return self.fgd.memo

    def choose(self, pod: PodRequest, rows: IntArray) -> tuple[int, int]:
        """:meth:`best`, scored 100 as :meth:`scores` scores the first of the order (without
        pricing the others)."""
        return self.best(pod, rows), 100

    def best(self, pod: PodRequest, rows: IntArray) -> int:
        """Position in ``rows`` of the first node of our order (the same node as sorting by
        all of :meth:`keys`, since rows are in rank order). FGD's score and the growth, the
        costly keys, are computed only on the nodes tied on the waste bucket."""
        if pod.gpu_memory_mib is None or not pod.gpu_count:
            # Card memory is not part of the per-state tables (a CPU-only pod takes no card).
            return self._best_by_order(pod, rows)
        return self._best_by_stages(pod, rows)

    def _best_by_stages(self, pod: PodRequest, rows: IntArray) -> int:
        """:meth:`best` by :meth:`key_stages`, each later key computed only on the nodes
        tied on the earlier ones."""
        stages = self.key_stages(pod)
        # The first key runs on every row: no index array to build or gather through.
        values = stages[0](rows)
        positions = np.flatnonzero(values == values.min())
        for key in stages[1:]:
            if positions.size == 1:
                break
            values = key(rows[positions])
            positions = positions[values == values.min()]
        return int(positions[0])

    def _best_by_order(self, pod: PodRequest, rows: IntArray) -> int:
        """:meth:`best` for a pod whose card memory does not matter: one argmin of the
        rows' order values (:data:`ORDER_STRIDE`), the least bucket, then the least
        remainder (a share's best card's free milli, FGD's best score for whole cards, the
        least growth for CPU-only pods), then the first row; a CPU-only pod's tied rows go
        on to the least free GPU. A whole-card or CPU-only pod's remainder is computed only
        when the argmin lands on an unscored value: its bucket is then the least, and every
        unscored state of that bucket is scored before the argmin is taken again. An argmin
        on a scored value needs nothing more, since an unscored state of the same bucket
        would have sorted before it."""
        ids = self.state.state_id[rows]
        key = _class_key("share" if pod.is_gpu_share else "stranded", pod)
        order = self._order_table(key)
        values = order[ids]
        at = int(values.argmin())  # the first NaN, if any: a state not priced yet
        low = float(values[at])
        if low != low:
            values = self._price(pod, key, order, rows, ids, values)
            at = int(values.argmin())
            low = float(values[at])
        if low == np.inf:  # no finite bucket: the later keys decide, as in keys()
            return self._best_by_stages(pod, rows)
        if pod.is_gpu_share:  # priced in full: bucket, then its best card's free milli
            return at
        if low % ORDER_STRIDE == UNSCORED:
            # The unscored states of the least bucket (scoring one alone in its bucket is
            # rare, and cheaper than looking for the others on every pod).
            tied = (values == low).nonzero()[0]
            if tied.size == 1 and pod.gpu_count:
                # One whole-card state, as a rule (the node the pod before filled): its
                # score as a Python int, without arrays of one.
                sid = int(ids[at])
                value = low + 101.0 - self.fgd.score_of_state(pod, sid)
                order[sid] = value
                values[at] = value
            else:
                values[tied] = self._score_unscored(pod, order, ids[tied], low)
            at = int(values.argmin())
        if pod.gpu_count:
            return at
        tied = (values == values[at]).nonzero()[0]
        if tied.size == 1:
            return at
        return int(tied[self.state.gpu_free_total[rows[tied]].argmin()])

    def _score_unscored(
        self, pod: PodRequest, order: FloatArray, ids: IntArray, unscored: FloatArray | float
    ) -> FloatArray:
        """The order values of node states ``ids``, unscored until now (``unscored``, their
        values: bucket × stride − 1), with their remainders, stored in ``order``."""
        scored: FloatArray = (unscored + 1.0) + self._remainders(pod, ids)
        order[ids] = scored
        return scored

    def _remainders(self, pod: PodRequest, ids: IntArray) -> FloatArray:
        """The order values' remainders of a pod taking no share on node states ``ids``."""
        if pod.gpu_count:
            scores = self.fgd.scores_of_states(pod, ids)
            remainders: FloatArray = np.subtract(100.0, scores, dtype=np.float64)
            return remainders
        return self._growth_of_states(pod, ids) + GROWTH_OFFSET

    def _price(
        self,
        pod: PodRequest,
        key: StageKey,
        order: FloatArray,
        rows: IntArray,
        ids: IntArray,
        values: FloatArray,
    ) -> FloatArray:
        """``values`` (order values of ``rows``, whose states are ``ids``) with each NaN, a
        state not priced yet for this pod class, priced here and in ``order``: a share in
        full (its best card's free milli is the remainder, read back by :meth:`card`), any
        other pod unscored."""
        state = self.state
        where = np.isnan(values).nonzero()[0]
        if where.size <= SCALAR_ROWS:
            # One or two nodes, as a rule: priced and stored one at a time in Python,
            # without the gathers and scatters numpy would spend on so few.
            entries = self._entries
            for at in where.tolist():
                i = int(rows[at])
                sid = int(ids[at])
                # The state's key holds what the price reads: free CPU and the cards' free
                # milli (sorted, on a node of one model).
                cpu, free, model = state.state_keys[sid]
                gpu_free = float(sum(free))
                if not pod.is_gpu_share:
                    bucket = self.waste.stranded_bucket_one(
                        entries[i], gpu_free, float(cpu), pod.total_gpu_milli, pod.cpu_milli
                    )
                    value = bucket * ORDER_STRIDE - 1.0
                elif isinstance(model, tuple):  # a node mixing models: per-card limits
                    bucket, col = self._share_choice_one(pod, i)
                    value = bucket * ORDER_STRIDE + float(state.card_free[i, col])
                else:
                    bucket, best_free = self.waste.share_best_one(
                        entries[i], free, gpu_free, float(cpu), pod.gpu_milli, pod.cpu_milli
                    )
                    value = bucket * ORDER_STRIDE + best_free
                order[sid] = value
                values[at] = value
            return values
        missing_rows = rows[where]
        missing_ids = ids[where]
        if pod.is_gpu_share:
            priced = self._share_order_values(pod, missing_rows)
        else:
            priced = self._stranded_bucket(pod, missing_rows) * ORDER_STRIDE - 1.0
        # Equal states give equal values: pricing every missing row (repeats included)
        # costs numpy less than finding the distinct states first.
        order[missing_ids] = priced
        values[where] = priced
        return values

    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        # Live scores for the extender: the order above mapped onto 100 … 0 (equal keys, equal
        # scores), so the best node scores 100 and the scheduler's own tie-break stays sane.
        if rows.size == 1:
            return np.full(1, 100, dtype=np.int64)
        return order_scores(self.keys(pod, rows))

    def keys(self, pod: PodRequest, rows: IntArray) -> list[FloatArray]:
        """Sort keys of ``rows`` for our policy, most significant first; rank breaks the rest.

        First, the waste the placement dooms (``kubegpu.placement.waste``), in cost
        buckets: for a share, the growth of its best card's unfillable gap plus the node's
        CPU-stranded GPU; for whole cards and CPU-only pods, the stranded GPU alone (a whole
        card leaves no gap). Measured on the openb grid, this is what beats FGD: most of what
        FGD leaves idle on a full cluster is card slivers no common share fits and cards on
        nodes out of CPU.

        Then, for a share, its best card's free milli: best fit, so a share closes a card
        already in use before it breaks a whole one that whole-card pods could take. For
        whole-card pods, FGD's integer score (negated), against FGD's classes covering
        :data:`POPULAR_PERCENT` of the workload (the rare multi-card classes the whole
        workload adds cost multi-GPU traces): it sees the CPU a node keeps for other classes,
        which the stranded bucket prices only at the workload's mean ratio (~0.3 pp on
        cpu250). Its coarse, truncated score lets the fixed rank decide near-ties, i.e. first
        fit, which consolidates load; exact values scatter it (~1 pp worse on openb's default
        trace). A share's FGD score, measured, buys nothing its best fit does not, and costs
        a scoring pass per new node state.

        CPU-only pods: after the stranded GPU, fragmentation growth in
        :data:`GROWTH_BUCKET_MILLI` buckets (against the same classes), then the node with
        the least free GPU: CPU spent where the cards are already allocated strands nothing.
        """
        return [key(rows).astype(np.float64) for key in self.key_stages(pod)]

    def key_stages(self, pod: PodRequest) -> list[Callable[[IntArray], KeyArray]]:
        """:meth:`keys` as functions of the rows, most significant first, each in the dtype
        it is kept in (whole numbers or ±inf: comparing them needs no conversion)."""
        if pod.is_gpu_share:
            return [
                lambda rows: self._share_key(pod, rows),
                lambda rows: self._share_fit_key(pod, rows),
            ]
        stranded = functools.partial(self._stranded_key, pod)
        if pod.gpu_count:
            return [stranded, lambda rows: -self.fgd.scores(pod, rows)]
        return [
            stranded,
            lambda rows: self._growth_bucket(pod, rows),
            lambda rows: self.state.gpu_free_total[rows],
        ]

    def card(self, i: int, pod: PodRequest) -> int:
        """Column of row ``i``'s card for a share (see :meth:`share_choice`).

        On a node of one model the chosen card is the first one whose free milli is the best
        card's (a card's cost depends on its free milli alone there), and that value is the
        remainder of the state's order value (:data:`ORDER_STRIDE`), priced when the node was
        ranked: the simulator asks for the card of the node it just chose, so it is a
        lookup, not a re-pricing."""
        state = self.state
        if pod.gpu_memory_mib is None and not state.mixed[i]:
            table = self._order_tables.get(_class_key("share", pod))
            sid = int(state.state_id[i])
            if table is not None and sid < table.size:
                value = float(table[sid])
                if value == value and value != np.inf:  # priced, and some card fits
                    free = int(value % ORDER_STRIDE)  # non-negative for a negative bucket too
                    return int(state.card_free[i].tolist().index(free))
        return int(self.share_choice(pod, np.array([i]))[1][0])

    def _share_order_values(self, pod: PodRequest, rows: IntArray) -> FloatArray:
        """A share's order value on each of ``rows`` (:data:`ORDER_STRIDE`): per card,
        bucket × stride + free milli, whose least is the best card's, as :meth:`share_choice`
        picks it (an infinite bucket where no card fits)."""
        buckets = self._card_buckets(pod, rows)
        values: FloatArray = (buckets * ORDER_STRIDE + self.state.card_free[rows]).min(axis=1)
        return values

    def _card_buckets(self, pod: PodRequest, rows: IntArray) -> FloatArray:
        """A share's cost bucket on each card of ``rows`` (+inf where it may not go)."""
        state = self.state
        bucket = self.waste.share_buckets(
            self.waste_entry[rows],
            state.card_free[rows],
            state.gpu_free_total[rows].astype(np.float64),
            state.cpu_free[rows].astype(np.float64),
            pod.gpu_milli,
            pod.cpu_milli,
        )
        if pod.gpu_memory_mib is not None or pod.gpu_models:
            bucket = np.where(eligible_cards(state, rows, pod), bucket, np.inf)
        return bucket

    def share_choice(self, pod: PodRequest, rows: IntArray) -> tuple[FloatArray, IntArray]:
        """For a GPU share on each of ``rows``: the cost bucket of its best card and that
        card's column. A card's cost is the growth of its unfillable gap plus the node's
        CPU-stranded GPU (weighted); the best card has the least bucket, then the least free
        milli (best fit), then the lowest index."""
        state = self.state
        if rows.size <= SCALAR_ROWS and pod.gpu_memory_mib is None:
            return self._share_choice_scalar(pod, rows)
        bucket = self._card_buckets(pod, rows)
        cols = card_values(bucket, state.card_free[rows]).argmin(axis=1)
        return bucket[np.arange(rows.size), cols], cols.astype(np.int64)

    def share_card_values(self, pod: PodRequest, rows: IntArray) -> FloatArray:
        """Per card of each of ``rows``: what a share costs there, as one number ordered as
        :meth:`share_choice` ranks cards (:func:`card_values`); the row minimum is its card.
        Prices any card, so a card someone else picks (DRA's allocator) is comparable."""
        return card_values(self._card_buckets(pod, rows), self.state.card_free[rows])

    def _share_choice_scalar(self, pod: PodRequest, rows: IntArray) -> tuple[FloatArray, IntArray]:
        """:meth:`share_choice` on a few rows, priced one node at a time in Python floats
        (:meth:`_share_choice_one`)."""
        buckets: list[float] = []
        cols: list[int] = []
        for i in rows.tolist():
            bucket, col = self._share_choice_one(pod, i)
            buckets.append(bucket)
            cols.append(col)
        return np.array(buckets, dtype=np.float64), np.array(cols, dtype=np.int64)

    def _share_choice_one(self, pod: PodRequest, i: int) -> tuple[float, int]:
        """:meth:`share_choice` on row ``i`` in Python floats
        (:meth:`ModelWaste.share_buckets_one`): the card is the first of the least
        (bucket × stride + free milli), as ``argmin`` picks it."""
        state = self.state
        free = state.card_free[i, : state.gpu_count[i]].tolist()
        bucket = self.waste.share_buckets_one(
            int(self.waste_entry[i]),
            free,
            float(state.gpu_free_total[i]),
            float(state.cpu_free[i]),
            pod.gpu_milli,
            pod.cpu_milli,
        )
        if pod.gpu_models:
            cards = state.model_selection(pod.gpu_models).cards
            if cards is not None:  # per-card model limits, only where a row mixes models
                allowed = cards[i].tolist()
                bucket = [b if allowed[c] else np.inf for c, b in enumerate(bucket)]
        # The real cards only: missing slots (free -1) price +inf, argmin never picks one.
        stride = 2 * MILLI_PER_GPU + 2
        best_col, best_value = 0, np.inf
        for col, (b, f) in enumerate(zip(bucket, free, strict=True)):
            value = b * stride + f
            if value < best_value:
                best_col, best_value = col, value
        return bucket[best_col], best_col

    # ----------------------------------------------------------------- the keys
    def _share_key(self, pod: PodRequest, rows: IntArray) -> KeyArray:
        """A share's first key on each of ``rows``: the cost bucket of its best card
        (:meth:`share_choice`), from the order values (priced once per node state and pod
        class)."""
        if pod.gpu_memory_mib is not None:  # card memory is not part of the state
            return self.share_choice(pod, rows)[0]
        return self._buckets(pod, _class_key("share", pod), rows)

    def _share_fit_key(self, pod: PodRequest, rows: IntArray) -> KeyArray:
        """A share's second key on each of ``rows``: its best card's free milli, the
        remainder of the order values (finite on a feasible row: some card fits)."""
        if pod.gpu_memory_mib is not None:
            cols = self.share_choice(pod, rows)[1]
            free: KeyArray = self.state.card_free[rows, cols]
            return free
        return split_order(self._order_values(pod, _class_key("share", pod), rows))[1]

    def _stranded_key(self, pod: PodRequest, rows: IntArray) -> KeyArray:
        """The first key of a pod taking no share on each of ``rows``: its stranded cost
        bucket (:meth:`_stranded_bucket`), from the order values like :meth:`_share_key`."""
        if pod.gpu_memory_mib is not None:  # card memory is not part of the state
            return self._stranded_bucket(pod, rows)
        return self._buckets(pod, _class_key("stranded", pod), rows)

    def _buckets(self, pod: PodRequest, key: StageKey, rows: IntArray) -> FloatArray:
        """The cost buckets of ``rows`` in their order values for pod class ``key``
        (:func:`split_order`)."""
        return split_order(self._order_values(pod, key, rows))[0]

    def _order_values(self, pod: PodRequest, key: StageKey, rows: IntArray) -> FloatArray:
        """The order values of ``rows`` for pod class ``key``, pricing the states not
        priced yet."""
        ids = self.state.state_id[rows]
        order = self._order_table(key)
        values = order[ids]
        if np.isnan(values).any():
            values = self._price(pod, key, order, rows, ids, values)
        return values

    def _stranded_bucket(self, pod: PodRequest, rows: IntArray) -> FloatArray:
        """Per row, the cost bucket of a pod taking no share (it leaves no card gap)."""
        state = self.state
        if rows.size <= SCALAR_ROWS:
            return np.array(
                [self._stranded_bucket_one(pod, i) for i in rows.tolist()], dtype=np.float64
            )
        return self.waste.stranded_buckets(
            self.waste_entry[rows],
            state.gpu_free_total[rows].astype(np.float64),
            state.cpu_free[rows].astype(np.float64),
            pod.total_gpu_milli,
            pod.cpu_milli,
        )

    def _stranded_bucket_one(self, pod: PodRequest, i: int) -> float:
        """:meth:`_stranded_bucket` of row ``i`` in Python floats."""
        state = self.state
        return self.waste.stranded_bucket_one(
            int(self.waste_entry[i]),
            float(state.gpu_free_total[i]),
            float(state.cpu_free[i]),
            pod.total_gpu_milli,
            pod.cpu_milli,
        )

    def _cpu_pod_growth(self, key: StateKey, pod: PodRequest) -> float:
        """Fragment growth F(n') − F(n) on state ``key`` when a CPU-only ``pod`` lands."""
        cpu, free, model = key
        before = self.memo.fragment(cpu, free, model)
        return self.memo.fragment(cpu - pod.cpu_milli, free, model) - before

    def _state_table(self, tables: dict[Any, Any], key: Any, dtype: Any) -> Any:
        """The cache of one pod shape's value per node state, NaN where not computed yet,
        grown (doubling) to hold every state seen so far."""
        table = tables.get(key)
        needed = len(self.state.state_keys)
        if table is None or table.size < needed:
            grown = np.full(max(needed * 2, 1024), np.nan, dtype=dtype)
            if table is not None:
                grown[: table.size] = table
            table = grown
            tables[key] = table
        return table

    def _order_table(self, key: StageKey) -> FloatArray:
        """Pod class ``key``'s order value per node state (see :data:`ORDER_STRIDE`)."""
        table: FloatArray = self._state_table(self._order_tables, key, np.float64)
        return table

    def _growth_bucket(self, pod: PodRequest, rows: IntArray) -> FloatArray:
        """Fragment growth of a CPU-only ``pod`` on each of ``rows`` in
        :data:`GROWTH_BUCKET_MILLI` buckets, read back from its order values (priced and
        scored here where they are not yet, and kept: the extender asks on every pod)."""
        key = _class_key("stranded", pod)
        values = self._order_values(pod, key, rows)
        unscored = values % ORDER_STRIDE == UNSCORED
        if unscored.any():
            fresh = self.state.state_id[rows][unscored]
            values[unscored] = self._score_unscored(
                pod, self._order_table(key), fresh, values[unscored]
            )
        growth: FloatArray = split_order(values)[1] - GROWTH_OFFSET
        return growth

    def _growth_of_states(self, pod: PodRequest, ids: IntArray) -> FloatArray:
        """Fragment growth of a CPU-only ``pod`` on each node state of ``ids`` (repeats
        allowed) in :data:`GROWTH_BUCKET_MILLI` buckets."""
        state = self.state
        sids = ids.tolist()
        # The growth reads the free CPU only through the fragments at it and at it less the
        # pod's, so (with the memo keyed by CPU level) it is one value per (level before,
        # level after, free milli, model): a state met before under another free CPU of the
        # same levels is a lookup, whatever CPU the pod asks.
        levelled = self._levelled_growth.setdefault(shape_key(pod), {})
        known: dict[int, float] = {}
        todo = fill_from_levelled(
            dict.fromkeys(sids),  # distinct, cheaper than np.unique
            state.state_keys,
            pod.cpu_milli,
            self.memo.cpu_key,
            levelled,
            known,
        )
        # One level before and after: the same fragment twice, a growth of exactly 0.
        flat = [(sid, coarse) for sid, coarse in todo if coarse[0] == coarse[1]]
        plain = [
            (sid, coarse)
            for sid, coarse in todo
            if isinstance(coarse[3], str) and coarse[0] != coarse[1]
        ]
        fragments = self.fgd.fragments_at_levels(pod, [coarse for _, coarse in plain])
        growths = [after[0] - before for before, after in fragments]
        for sid, coarse in todo:
            if not isinstance(coarse[3], str) and coarse[0] != coarse[1]:  # mixed models
                growths.append(self._cpu_pod_growth(state.state_keys[sid], pod))
                plain.append((sid, coarse))
        growths.extend(0.0 for _ in flat)
        plain.extend(flat)
        for (sid, coarse), growth in zip(plain, growths, strict=True):
            # Rounded first: float noise must not move a growth across a bucket boundary
            # (numpy's rounding, as the vectorised keys use).
            bucket = numpy_floor(numpy_round6(growth) / GROWTH_BUCKET_MILLI)
            known[sid] = bucket
            levelled[coarse] = bucket
        return np.array([known[sid] for sid in sids], dtype=np.float64)


def target(classes: Sequence[ClassKey]) -> TypicalWorkload:
    """Our target workload: every class, models as sets (the scorer cuts to FGD's popular
    classes itself where it needs to, :meth:`KubegpuScorer.keys`)."""
    # Counted first: a cluster's thousands of pods come in a few dozen classes, and spelling
    # each spec as a set per pod cost the extender's workload refresh ~25 ms at 12,000 pods.
    as_sets: Counter[ClassKey] = Counter()
    for (c, m, n, s), count in Counter(classes).items():
        as_sets[(c, m, n, "|".join(sorted(spec_models(s))))] += count
    return TypicalWorkload.from_classes(as_sets.elements(), popularity_percent=100.0)


def node_scorer(inputs: PolicyInputs) -> KubegpuScorer:
    """The registry's node scorer of ours.

    Fragmentation is measured against FGD's popular classes only (see
    :meth:`KubegpuScorer.keys`): the rare classes of the whole workload cost multi-GPU
    traces. The waste is priced per card model, since pods limited to models fill only their
    models' cards."""
    workload = required_workload(inputs)
    fgd = fgd_scorer(inputs, workload.popular(POPULAR_PERCENT))
    weights = inputs.waste_weights or WasteWeights()
    waste = ModelWaste.build(workload, inputs.state.capacity_by_model(), weights)
    return KubegpuScorer(inputs.state, fgd, waste)


class WasteCards:
    """Our card choice: the card whose use dooms the least waste, then the tightest."""

    def __init__(self, scorer: KubegpuScorer) -> None:
        self.scorer = scorer

    def choose(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        return (self.scorer.card(i, pod),)


def _waste_cards(inputs: PolicyInputs, scorer: NodeScorer) -> CardChooser:
    # Our node scorer's own tables: it priced the chosen node by this very card.
    return WasteCards(scorer if isinstance(scorer, KubegpuScorer) else node_scorer(inputs))


# A DRA driver cannot publish our choice as one comparator; device_order searches the order
# that serves the workload's next share best.
CARDS = CardRule("waste", _waste_cards, searched_order=True)


def card_values(buckets: FloatArray, free: IntArray) -> FloatArray:
    """Lexicographic (cost bucket, free milli) per card in one number: free milli is below
    the stride, and a card the share does not fit has an infinite bucket whatever its free
    milli. The least is the best card: least waste, then best fit."""
    values: FloatArray = buckets * (2 * MILLI_PER_GPU + 2) + free
    return values


def split_order(values: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Order values (:data:`ORDER_STRIDE`) as their buckets and remainders: ``floor((value +
    1) / stride)`` is the bucket whatever the remainder (−1 … stride − 2), and dividing by a
    power of two is exact."""
    buckets: FloatArray = np.floor((values + 1.0) / ORDER_STRIDE)
    return buckets, values - buckets * ORDER_STRIDE


def order_scores(keys: Sequence[npt.NDArray[np.float64]]) -> IntArray:
    """Scores 100 … 0 from sort keys (most significant first, equal-length, at least two
    elements): each element scores ``100 - p·100 div (n−1)``, where ``p`` is the position in
    the stable lexicographic order of the first element with the same keys, so equal keys
    score equally and the best scores 100.

    Vectorised (a Python loop over the order cost ~5 ms at 5,000 nodes); a test holds it equal
    to that loop. NaN never equals NaN here, as with Python floats.
    """
    n = keys[0].size
    order = np.lexsort(tuple(reversed(keys)))
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for key in keys:
        ordered = key[order]
        starts[1:] |= ordered[1:] != ordered[:-1]
    position = np.maximum.accumulate(np.where(starts, np.arange(n, dtype=np.int64), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = 100 - position * 100 // (n - 1)
    return out
