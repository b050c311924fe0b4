"""The placement engine: a cluster's state plus one policy, behind one small API.

:class:`PlacementEngine` is a :class:`~kubegpu.placement.state.ClusterState` (the numpy arrays
and every change to them) that also knows its policy: it asks
:mod:`~kubegpu.placement.feasibility` where a pod fits, :mod:`~kubegpu.placement.explain` why
not, the policy's node scorer (:mod:`~kubegpu.placement.policies`) which node is best, and the
card table (:mod:`~kubegpu.placement.policies.cards`) which cards. The scheduler extender
(filter / prioritize / bind) and the trace simulator both go through this class, so what we
measure offline is what runs live. (The device plugin's preferred allocation is a different
question, which cards of one node are best connected: ``kubegpu.placement.topology``.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kubegpu.placement import explain as _explain
from kubegpu.placement.explain import (
    FITS,
    FITS_WITHOUT_GPU,
)
from kubegpu.placement.feasibility import eligible_cards, feasible_rows
from kubegpu.placement.fragmentation import FragmentationMemo, TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU, Fit, NodeState, Placement, PodRequest
from kubegpu.placement.policies import GpuChoice, NodeScore, PolicySpec, get_policy, simple
from kubegpu.placement.policies.cards import (
    CARD_KEYS,
    first_by_keys,
    lowest_full_cards,
    random_card,
)
from kubegpu.placement.policies.fgd import FgdScorer
from kubegpu.placement.policies.kubegpu import (
    POPULAR_PERCENT,
    KubegpuScorer,
    order_scores,
)
from kubegpu.placement.state import (
    ClusterState,
    FloatArray,
    IntArray,
    RowShapeChanged,
)
from kubegpu.placement.waste import ModelWaste, WasteWeights

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
    ) -> None:
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        if self.policy.node_score in (NodeScore.FGD, NodeScore.KUBEGPU) and workload is None:
            raise ValueError(f"policy {self.policy.name} needs a target workload")
        self._rng = np.random.default_rng(seed)
        super().__init__(nodes, track_states=workload is not None)
        self._fgd: FgdScorer | None = None
        self._kubegpu: KubegpuScorer | None = None
        if workload is not None:
            # Every memo keys the free CPU by its level (FragmentationMemo): the same values,
            # computed less often. FGD gets it too: a baseline kept slow on purpose would only
            # flatter our policy's speed against it.
            if self.policy.node_score is NodeScore.KUBEGPU:
                # Ours measures fragmentation against FGD's popular classes only (see
                # KubegpuScorer.keys): the rare classes of the whole workload cost
                # multi-GPU traces.
                workload_measured = workload.popular(POPULAR_PERCENT)
            else:
                workload_measured = workload
            self._fgd = FgdScorer(self, FragmentationMemo(workload_measured, cpu_levels=True))
            if (
                self.policy.node_score is NodeScore.KUBEGPU
                or self.policy.gpu_choice is GpuChoice.WASTE
            ):
                # Ours orders nodes first by the waste a placement dooms, per card model,
                # since pods limited to models fill only their models' cards.
                weights = waste_weights or WasteWeights()
                waste = ModelWaste.build(workload, self.capacity_by_model(), weights)
                self._kubegpu = KubegpuScorer(self, self._fgd, waste)

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

    # ----------------------------------------------------------------- scoring
    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        """The policy's integer score (higher is better) of each of ``rows``, all feasible."""
        kind = self.policy.node_score
        if rows.size == 0:
            return np.zeros(0, dtype=np.int64)
        if kind is NodeScore.RANDOM:
            return simple.random_score(self._rng, rows)
        if kind is NodeScore.DOT_PROD:
            return simple.dot_prod(self, pod, rows)
        if kind is NodeScore.GPU_CLUSTERING:
            return simple.gpu_clustering(self, pod, rows)
        if kind is NodeScore.GPU_PACKING:
            return simple.gpu_packing(self, pod, rows)
        if kind is NodeScore.BEST_FIT:
            return simple.best_fit(self, pod, rows)
        if kind is NodeScore.SPREAD:
            return simple.spread(self, pod, rows)
        if kind is NodeScore.FGD:
            assert self._fgd is not None
            return self._fgd.scores(pod, rows)
        assert self._kubegpu is not None
        return self._kubegpu.scores(pod, rows)

    def _kubegpu_keys(self, pod: PodRequest, rows: IntArray) -> list[FloatArray]:
        """Our policy's sort keys of ``rows`` (:meth:`KubegpuScorer.keys`)."""
        assert self._kubegpu is not None
        return self._kubegpu.keys(pod, rows)

    def _kubegpu_best(self, pod: PodRequest, rows: IntArray) -> int:
        """Position in ``rows`` of our policy's best node (:meth:`KubegpuScorer.best`)."""
        assert self._kubegpu is not None
        return self._kubegpu.best(pod, rows)

    # ----------------------------------------------------------------- card choice
    def pick_columns(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        """Card columns of row ``i`` the policy gives ``pod`` (which must fit there)."""
        if pod.gpu_count == 0:
            return ()
        if pod.gpu_milli >= MILLI_PER_GPU:
            # Whole cards: every policy takes the lowest-index fully free ones.
            return lowest_full_cards(self, i, pod)
        choice = self.policy.gpu_choice
        keys = CARD_KEYS.get(choice)
        if keys is not None:
            return (first_by_keys(keys(self, i), self._eligible_row(i, pod)),)
        if choice is GpuChoice.RANDOM:
            return (random_card(self._rng, self._eligible_row(i, pod)),)
        if choice is GpuChoice.WASTE:
            assert self._kubegpu is not None
            return (self._kubegpu.card(i, pod),)
        assert self._fgd is not None
        return self._fgd.row_choice(i, pod)[1]

    def _eligible_row(self, i: int, pod: PodRequest) -> npt.NDArray[np.bool_]:
        row: npt.NDArray[np.bool_] = eligible_cards(self, np.array([i]), pod)[0]
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
        if self._kubegpu is not None and self.policy.node_score is NodeScore.KUBEGPU:
            best = self._kubegpu.best(pod, rows)
            i = int(rows[best])
            return i, self.pick_columns(i, pod), 100
        scores = self.scores(pod, rows)
        best = int(scores.argmax())  # first maximum = smallest rank among the best
        i = int(rows[best])
        return i, self.pick_columns(i, pod), int(scores[best])

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
