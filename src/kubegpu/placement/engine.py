"""The placement engine: a cluster's state plus one policy, behind one small API.

:class:`PlacementEngine` is a :class:`~kubegpu.placement.state.ClusterState` (the numpy arrays
and every change to them) that also knows its policy: it asks
:mod:`~kubegpu.placement.feasibility` where a pod fits, :mod:`~kubegpu.placement.explain` why
not, and the node scorer and card chooser it built from its policy's registry entry
(:mod:`kubegpu.placement.policies`, the shapes in :mod:`kubegpu.placement.policy`) which node
and which card is best. The scheduler extender (filter / prioritize / bind) and the trace
simulator both go through this class, so what we measure offline is what runs live. (DRA's
card choice, first fit in a device order, is :mod:`kubegpu.placement.device_order`; the device
plugin's preferred allocation is a different question, which cards of one node are best
connected: ``kubegpu.placement.topology``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from kubegpu.placement import explain as _explain
from kubegpu.placement.explain import (
    FITS,
    FITS_WITHOUT_GPU,
)
from kubegpu.placement.feasibility import eligible_cards, feasible_rows, fitting_cards
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import (
    MILLI_PER_GPU,
    Fit,
    NodeState,
    Placement,
    PodRequest,
)
from kubegpu.placement.policies import PolicySpec, get_policy
from kubegpu.placement.policies.cards import first_by_keys, lowest_full_cards
from kubegpu.placement.policies.kubegpu import order_scores
from kubegpu.placement.policy import PolicyInputs
from kubegpu.placement.state import (
    NO_ROWS,
    ClusterState,
    IntArray,
    RowShapeChanged,
)
from kubegpu.placement.waste import WasteWeights

# The engine's API; RowShapeChanged (placement.state) and order_scores (policies.kubegpu) are
# re-exported because the extender and the tests take them from here.
__all__ = [
    "PlacementEngine",
    "RowShapeChanged",
    "filter_nodes",
    "order_scores",
    "pick_gpus",
    "score_nodes",
]


class PlacementEngine(ClusterState):
    """A cluster's free resources plus one policy.

    ``workload`` is the target workload FGD and Kubegpu measure fragmentation against (required
    for them, ignored otherwise). ``seed`` drives the Random policy only. ``waste_weights``
    are Kubegpu's measured constants (``kubegpu.placement.waste``); only benchmarks vary them.
    """

    def __init__(
        self,
        nodes: Sequence[NodeState],
        policy: PolicySpec | str,
        workload: TypicalWorkload | None = None,
        seed: int = 0,
        waste_weights: WasteWeights | None = None,
        pace: Callable[[], None] | None = None,
    ) -> None:
        """``pace``: see :class:`~kubegpu.placement.state.ClusterState` (the extender's
        background build steps aside there)."""
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        if self.policy.needs_workload and workload is None:
            raise ValueError(f"policy {self.policy.name} needs a target workload")
        self._rng = np.random.default_rng(seed)
        super().__init__(nodes, track_states=workload is not None, pace=pace)
        self._levelled_memo: (
            tuple[PodRequest, IntArray, int, tuple[list[tuple[PodRequest, IntArray]], IntArray]]
            | None
        ) = None
        inputs = PolicyInputs(self, workload, self._rng, waste_weights)
        self.node_scorer = self.policy.node_scorer(inputs)
        if pace is not None:
            pace()
        self.card_chooser = self.policy.cards.build(inputs, self.node_scorer)

    # ----------------------------------------------------------------- feasibility
    def feasible_rows(self, pod: PodRequest) -> IntArray:
        """Rows (in tie-break order) of the nodes the pod fits on."""
        return feasible_rows(self, pod)

    def explain(self, node: str, pod: PodRequest) -> Fit:
        """Whether ``pod`` fits ``node`` now, and if not, the first reason why."""
        check, reason = _explain.explain_row(self, self.row_of(node), pod)
        if check in (FITS, FITS_WITHOUT_GPU):
            return Fit(node, True)
        return Fit(node, False, reason)

    def explain_row(self, i: int, pod: PodRequest) -> tuple[int, str]:
        """The first check ``pod`` fails on row ``i`` (``CHECK_*``) and its reason, or
        (``FITS``/``FITS_WITHOUT_GPU``, "")."""
        return _explain.explain_row(self, i, pod)

    def retire(self, pace: Callable[[], None] | None = None) -> None:
        """Drop the policy's scorers, which hold the engine (and it them): a replaced engine
        then goes by reference count at once, rather than waiting, with its arrays and
        tables, for the next full cyclic collection, which the whole process pauses for.

        With ``pace``, the fragmentation states the engine met while serving are let go
        :data:`~kubegpu.placement.state.STATES_PER_PACE` at a time, ``pace`` called between:
        a key per state met, 60,000 after some minutes at 5,000 nodes, and freed at once
        (with the rest) they held the GIL 15-45 ms, which the extender's decisions waited
        out when it swapped engines (issue 32's soak). The rest goes at once, as before."""
        del self.node_scorer, self.card_chooser
        self._levelled_memo = None
        if pace is not None:
            self.forget_states(pace)

    # ----------------------------------------------------------------- levels
    def share_levels(self, pod: PodRequest, rows: IntArray) -> IntArray:
        """Per row of ``rows``, how much of a card there ``pod`` takes, in milli of the card
        (:meth:`~kubegpu.placement.model.PodRequest.card_milli` against the row's card memory): what
        the policies score a share by. Its ``gpu_milli`` where levels do not apply."""
        if not self._levels(pod):
            return np.full(rows.size, pod.gpu_milli, dtype=np.int64)
        sizes = self.card_memory_sizes.tolist()
        if len(sizes) == 1:  # one card memory in the cluster: the common case
            return np.full(rows.size, pod.card_milli(sizes[0] or None), dtype=np.int64)
        by_size = np.array([pod.card_milli(t or None) for t in sizes], dtype=np.int64)
        levels: IntArray = by_size[self.row_memory_size[rows]]
        return levels

    def _levels(self, pod: PodRequest) -> bool:
        return self.levels_memory and pod.is_gpu_share

    def levelled(
        self, pod: PodRequest, rows: IntArray
    ) -> tuple[list[tuple[PodRequest, IntArray]], IntArray]:
        """``pod`` as the policies score it on ``rows`` (feasible, in rank order): a list of
        (the pod at one level, the positions in ``rows`` where that is its level and a card
        fits it there), and the positions where it fits as asked but at its level on no
        card (a card with compute left and memory not, for a pod asking compute alone): the
        policies cannot score those, so they rank last, and :meth:`pick_columns` takes the
        tightest card that fits.

        The pod scored carries no memory: its level holds it (filter and bind check the
        memory itself), and the policies' per-state tables need no per-row memory check.
        Where levels do not apply (no card memory known, or not a share) it is the pod on
        every row."""
        every = np.arange(rows.size, dtype=np.int64)
        if not self._levels(pod):
            return [(pod, every)], NO_ROWS
        memo = self._levelled_memo
        # The extender's ranking asks for scores and the best node of one pod and row array in
        # a row: the second call reuses the first's split while nothing has changed.
        if memo is not None and memo[0] is pod and memo[1] is rows and memo[2] == self.version:
            return memo[3]
        levels = self.share_levels(pod, rows)
        groups: list[tuple[PodRequest, IntArray]] = []
        left: list[IntArray] = []
        distinct = np.unique(levels).tolist()
        for level in distinct:
            where = every if len(distinct) == 1 else every[levels == level]
            at_level = replace(pod, gpu_milli=level)
            if pod.gpu_models:  # some cards of a row may not be allowed: check card by card
                fits = eligible_cards(self, rows[where], at_level).any(axis=1)
            else:
                fits = self.largest_level[rows[where]] >= level
            groups.append((replace(at_level, gpu_memory_mib=None), where[fits]))
            left.append(where[~fits])
        found = groups, np.concatenate(left) if left else NO_ROWS
        self._levelled_memo = (pod, rows, self.version, found)
        return found

    # ----------------------------------------------------------------- scoring
    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        """The policy's integer score (higher is better) of each of ``rows``, all feasible."""
        if rows.size == 0:
            return np.zeros(0, dtype=np.int64)
        groups, left = self.levelled(pod, rows)
        if len(groups) == 1 and not left.size:
            return self.node_scorer.scores(groups[0][0], rows)
        out = np.zeros(rows.size, dtype=np.int64)
        for scored, where in groups:
            if where.size:
                out[where] = self.node_scorer.scores(scored, rows[where])
        return out

    def best_position(self, pod: PodRequest, rows: IntArray) -> tuple[int, int]:
        """The position in ``rows`` (feasible, in rank order) of the node the engine places
        ``pod`` on, and its score: the policy's choice (a DRA variant also weighs the card
        the allocator will take, :mod:`kubegpu.placement.device_order`). Rows of different
        card memory are scored at the pod's level on each, best score first, ties to rank
        order; if the pod is at its level on no card, the first row."""
        groups, left = self.levelled(pod, rows)
        if len(groups) == 1 and not left.size:
            return self.node_scorer.choose(groups[0][0], rows)
        best: tuple[int, int] | None = None
        for scored, where in groups:
            if where.size:
                k, score = self.node_scorer.choose(scored, rows[where])
                position = int(where[k])
                if best is None or (score, -position) > (best[1], -best[0]):
                    best = (position, score)
        return best if best is not None else (0, 0)

    # ----------------------------------------------------------------- card choice
    def pick_columns(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        """Card columns of row ``i`` the policy gives ``pod`` (which must fit there)."""
        if pod.gpu_count == 0:
            return ()
        if pod.gpu_milli >= MILLI_PER_GPU:
            # Whole cards: every policy takes the lowest-index fully free ones.
            return lowest_full_cards(self, i, pod)
        if not self._levels(pod):
            return self.card_chooser.choose(i, pod)
        row = np.array([i])
        at_level = replace(pod, gpu_milli=int(self.share_levels(pod, row)[0]))
        if eligible_cards(self, row, at_level)[0].any():
            return self.card_chooser.choose(i, at_level)
        # It fits as asked but at its level on no card (see levelled): the tightest that fits.
        return (first_by_keys((self.card_free[i],), fitting_cards(self, row, pod)[0]),)

    def _eligible_row(self, i: int, pod: PodRequest) -> npt.NDArray[np.bool_]:
        """Which card columns of row ``i`` fit ``pod`` as asked (what an allocator checks)."""
        row: npt.NDArray[np.bool_] = fitting_cards(self, np.array([i]), pod)[0]
        return row

    # ----------------------------------------------------------------- public, by name
    def filter(self, pod: PodRequest) -> list[Fit]:
        """Every node's fit for ``pod``, with a reason for each node it does not fit."""
        feasible = set(self.feasible_rows(pod).tolist())
        return [
            Fit(name, True) if i in feasible else self.explain(name, pod)
            for i, name in enumerate(self.names)
        ]

    def score(self, pod: PodRequest, nodes: Sequence[str] | None = None) -> dict[str, int]:
        """Policy score (0…100, higher is better) of the given nodes the pod fits on.

        Scores are relative to the scored set (BestFit normalises over it), as in the
        scheduler framework; nodes the pod does not fit get no entry.
        """
        rows = self.feasible_rows(pod)
        if nodes is not None:
            wanted = {self.row_of(n) for n in nodes}
            rows = rows[np.isin(rows, list(wanted))]
        return dict(
            zip((self.names[i] for i in rows), self.scores(pod, rows).tolist(), strict=True)
        )

    def pick_gpus(self, node: str, pod: PodRequest) -> tuple[int, ...]:
        """Device indices on ``node`` the policy gives ``pod``; raises if it does not fit."""
        fit = self.explain(node, pod)
        if not fit.fits:
            raise ValueError(fit.reason)
        i = self.row_of(node)
        return tuple(self.card_index[i][c] for c in self.pick_columns(i, pod))

    def choose(self, pod: PodRequest) -> Placement | None:
        """Best node and cards for ``pod`` (not bound); ``None`` if it fits nowhere."""
        found = self._choose_row(pod)
        if found is None:
            return None
        i, cols, score = found
        return Placement(self.names[i], tuple(self.card_index[i][c] for c in cols), score)

    def _choose_row(self, pod: PodRequest) -> tuple[int, tuple[int, ...], int] | None:
        rows = self.feasible_rows(pod)
        if rows.size == 0:
            return None
        best, score = self.best_position(pod, rows)
        i = int(rows[best])
        return i, self.pick_columns(i, pod), score

    def place(self, pod: PodRequest) -> Placement | None:
        """Choose and bind in one step (the simulator's loop); ``None`` if unschedulable."""
        found = self._choose_row(pod)
        if found is None:
            return None
        i, cols, score = found
        self.allocate_row(i, pod, cols)
        return Placement(self.names[i], tuple(self.card_index[i][c] for c in cols), score)

    def allocate(self, node: str, pod: PodRequest, gpu_indices: tuple[int, ...]) -> None:
        """Record that ``pod`` is bound to ``node`` on ``gpu_indices`` (device indices)."""
        i = self.row_of(node)
        self.allocate_row(i, pod, tuple(self.card_index[i].index(g) for g in gpu_indices))

    def release(self, node: str, pod: PodRequest, gpu_indices: tuple[int, ...]) -> None:
        """Record that ``pod`` left ``node``, freeing ``gpu_indices``."""
        i = self.row_of(node)
        self.release_row(i, pod, tuple(self.card_index[i].index(g) for g in gpu_indices))


# ----------------------------------------------------------------- one-shot helpers
# For callers that hold node values rather than a long-lived engine. Each builds an engine for
# the call.


def filter_nodes(nodes: Sequence[NodeState], pod: PodRequest) -> list[Fit]:
    """Fit of ``pod`` on each node, with a reason where it does not fit."""
    return PlacementEngine(nodes, "bestfit").filter(pod)


def score_nodes(
    nodes: Sequence[NodeState],
    pod: PodRequest,
    policy: PolicySpec | str,
    workload: TypicalWorkload | None = None,
) -> dict[str, int]:
    """Score 0…100 of each node ``pod`` fits on (absent: does not fit)."""
    return PlacementEngine(nodes, policy, workload).score(pod)


def pick_gpus(
    node: NodeState,
    pod: PodRequest,
    policy: PolicySpec | str,
    workload: TypicalWorkload | None = None,
) -> tuple[int, ...]:
    """Device indices on ``node`` for ``pod``; raises ``ValueError`` with the reason if it
    does not fit."""
    return PlacementEngine([node], policy, workload).pick_gpus(node.name, pod)
