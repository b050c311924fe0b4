"""Card choice as DRA's allocator makes it: the first device in slice order that fits.

Under Dynamic Resource Allocation the scheduler's allocator, not a scorer, picks the device: it
walks the node's pool in slice order and takes the first device with enough free capacity (for
consumable capacity, the first whose remaining memory and compute cover the request), and
Kubernetes has no device scoring yet (KEP-4970). A scheduler extender can still rank *nodes*;
the card is out of its hands. :class:`DeviceOrderEngine` models that: the card is the first
fit in a device order, and the node is the policy's choice with, for our policy's shares, each
node priced by the card first fit will take there rather than by its best card
(:meth:`DeviceOrderEngine.best_position`; the extender's DRA ranking runs this engine). (The
engine's own card choice is the policy's, :mod:`kubegpu.placement.engine`; this is its DRA
variant, beside it.)

* ``first-fit``: the order our driver publishes, device (GPU) index order.
* ``steered``: the order a driver could publish to steer first fit, re-published whenever the
  node's allocations change. For a policy whose card rule is a comparator (BestFit, Spread;
  :attr:`CardRule.keys <kubegpu.placement.policy.CardRule.keys>`) that comparator's order,
  which makes first fit the policy's choice. For ours: the order of
  the node's cards (by free milli) that minimises the expected cost of the *next* share's first
  fit over the workload's share classes, the cost being our own card key for that share
  (:meth:`DeviceOrderEngine._search_order`). One order cannot suit every share size: under a
  node choice blind to the allocator's card it recovered about half of what first fit lost;
  the node choice that prices that card recovers most of it with or without an order
  (docs/benchmarks.md, "Placement quality under DRA").

Either way the allocator's accounting stays the authority: a card is taken only if the pod
fits it now (:func:`~kubegpu.placement.feasibility.fitting_cards`), the order only says which
of the fitting cards comes first, so no order can over-commit a card.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.feasibility import fitting_cards
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU, NodeState, PodRequest
from kubegpu.placement.policies import POLICIES, PolicySpec
from kubegpu.placement.policies.kubegpu import WasteCards
from kubegpu.placement.state import IntArray
from kubegpu.placement.waste import WasteWeights


class CardChoice(enum.Enum):
    POLICY = "policy"  # the policy's own card choice (the device plugin + extender today)
    FIRST_FIT = "first-fit"  # DRA's allocator over devices in index order
    STEERED = "steered"  # DRA's allocator over devices the driver ordered for the typical share


DEFAULT_CARD_CHOICE = CardChoice.POLICY
# A node's distinct free milli values up to which every order of them is tried (6! = 720).
MAX_SEARCHED_VALUES = 6


def parse_card_choice(name: str) -> CardChoice:
    """A :class:`CardChoice` by its CLI name; ``ValueError`` naming the known ones."""
    try:
        return CardChoice(name.strip().lower())
    except ValueError:
        known = ", ".join(c.value for c in CardChoice)
        raise ValueError(f"unknown card choice {name!r}; known: {known}") from None


def check_steerable(policy: PolicySpec) -> None:
    """``ValueError`` unless ``policy``'s card preference can be published as a device order
    (:attr:`CardRule.publishable <kubegpu.placement.policy.CardRule.publishable>`): FGD's and
    Random's choices rank nothing a slice could carry."""
    if not policy.cards.publishable:
        steerable = ", ".join(p.name for p in POLICIES.values() if p.cards.publishable)
        raise ValueError(
            f"card choice 'steered' needs a policy whose card preference is an order a driver "
            f"can publish; {policy.name} chooses cards by {policy.cards.name} "
            f"(steerable: {steerable})"
        )


def share_classes(workload: TypicalWorkload | None) -> tuple[tuple[PodRequest, float], ...]:
    """The workload's single-card share classes and their weights (models left open: the
    order is about how full each card is, whatever its model)."""
    if workload is None:
        return ()
    return tuple(
        (PodRequest(t.cpu_milli, 0, 1, t.gpu_milli, name="typical-share"), t.weight)
        for t in workload.pods
        if t.gpu_count == 1 and 0 < t.gpu_milli < MILLI_PER_GPU
    )


def first_fit(order: IntArray, eligible: npt.NDArray[np.bool_], count: int) -> tuple[int, ...]:
    """The first ``count`` columns of ``order`` that are ``eligible``: the allocator's walk.
    ``ValueError`` if fewer fit (the node was chosen as feasible, so this is a bug)."""
    fitting = order[eligible[order]]
    if fitting.size < count:
        raise ValueError(f"only {fitting.size} of the {count} cards asked for fit")
    return tuple(int(c) for c in fitting[:count])


class DeviceOrderEngine(PlacementEngine):
    """The placement engine with DRA's card choice: the node by ``policy``, the card by first
    fit in slice order (``FIRST_FIT``) or in the order a steering driver publishes
    (``STEERED``). ``POLICY`` behaves exactly as :class:`PlacementEngine`."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        policy: PolicySpec | str,
        workload: TypicalWorkload | None = None,
        seed: int = 0,
        waste_weights: WasteWeights | None = None,
        card_choice: CardChoice = DEFAULT_CARD_CHOICE,
        *,
        published_orders: Mapping[str, Sequence[int]] | None = None,
        allocator_aware: bool = True,
    ) -> None:
        # Rows whose free resources changed since their steered order was last computed
        # (refresh_row adds to it, from the base class's constructor on).
        self._stale_orders: set[int] = set()
        super().__init__(nodes, policy, workload, seed=seed, waste_weights=waste_weights)
        # Per row, each card column's position in its device order (index order until a
        # row's steered order is computed).
        self._positions: IntArray = np.broadcast_to(
            np.arange(self.card_free.shape[1], dtype=np.int64), self.card_free.shape
        ).copy()
        if card_choice is CardChoice.STEERED:
            check_steerable(self.policy)
        self.card_choice = card_choice
        self.allocator_aware = allocator_aware
        self.shares = share_classes(workload)
        # Rows whose slice lists its cards in an order other than index order, as read from
        # the cluster (the extender): row -> card columns in slice order.
        self._published: dict[int, IntArray] = {}
        for node, indices in (published_orders or {}).items():
            self.set_published_order(node, indices)
        # Per node state (free CPU, free milli per card, model): the published order of the
        # distinct free milli values, so each state's order is searched once.
        self._value_orders: dict[int, tuple[int, ...]] = {}

    def set_published_order(self, node: str, indices: Sequence[int]) -> None:
        """``node``'s slice lists its cards (device indices) in ``indices`` order; cards it
        does not name follow in index order."""
        i = self.row_of(node)
        columns = list(self.card_index[i][: self.gpu_count[i]])
        ordered = [columns.index(g) for g in dict.fromkeys(indices) if g in columns]
        ordered += [c for c in range(len(columns)) if c not in ordered]
        order = np.array(ordered, dtype=np.int64)
        if ordered == sorted(ordered):
            self._published.pop(i, None)
        else:
            self._published[i] = order
        self._positions[i, order] = np.arange(order.size)

    def best_position(self, pod: PodRequest, rows: IntArray) -> tuple[int, int]:
        """For a share under our policy, the node whose card *the allocator will take* (the
        first fit in its device order) costs least by our card cost, ties to rank order;
        the policy's own choice otherwise.

        The policy ranks a node by its best card, but DRA's allocator takes the first card
        that fits, so ranking by the best card sends the share to a node where it then lands
        on a worse one. Pricing the card the allocator takes instead finds, among a
        cluster's many nodes, one where first fit *is* a good card: on openb's share-heavy
        trace this recovers most of what first fit loses (docs/benchmarks.md, "Placement
        quality under DRA")."""
        chooser = self.card_chooser
        if (
            self.card_choice is CardChoice.POLICY
            or not self.allocator_aware
            or not pod.is_gpu_share
            or not isinstance(chooser, WasteCards)
            or rows.size == 0
        ):
            return super().best_position(pod, rows)
        groups, _ = self.levelled(pod, rows)
        if len(groups) == 1 and groups[0][1].size == rows.size:
            values = chooser.scorer.share_card_values(groups[0][0], rows)
        else:
            # Rows of other card memories at the pod's level on each; rows where it is at its
            # level on no card are never preferred (see PlacementEngine.levelled).
            values = np.full(self.card_free[rows].shape, np.inf)
            for scored, where in groups:
                if where.size:
                    values[where] = chooser.scorer.share_card_values(scored, rows[where])
        taken = self.first_fit_columns(rows, fitting_cards(self, rows, pod))
        best = int(values[np.arange(rows.size), taken].argmin())  # first least: rank order
        return best, 100

    def refresh_row(self, i: int) -> None:
        super().refresh_row(i)
        self._stale_orders.add(i)

    def first_fit_columns(self, rows: IntArray, eligible: npt.NDArray[np.bool_]) -> IntArray:
        """Per row of ``rows``, the column of the first ``eligible`` card in its device order
        (each row needs one; a row with none reads column 0)."""
        if self.card_choice is CardChoice.STEERED and self._stale_orders:
            for i in self._stale_orders:
                order = self.device_order(i)
                self._positions[i, order] = np.arange(order.size)
            self._stale_orders.clear()
        columns: IntArray = np.where(eligible, self._positions[rows], eligible.shape[1]).argmin(
            axis=1
        )
        return columns

    def pick_columns(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        if self.card_choice is CardChoice.POLICY or pod.gpu_count == 0:
            return super().pick_columns(i, pod)
        eligible = self._eligible_row(i, pod)[: self.gpu_count[i]]
        return first_fit(self.device_order(i), eligible, pod.gpu_count)

    def device_order(self, i: int) -> IntArray:
        """Row ``i``'s card columns in the order its ResourceSlice lists them now."""
        count = int(self.gpu_count[i])
        index_order = np.arange(count, dtype=np.int64)
        published = self._published.get(i)
        if published is not None:
            return published
        if self.card_choice is not CardChoice.STEERED:
            return index_order
        keys = self.policy.cards.keys
        if keys is not None:
            # The policy's comparator orders all cards alike, whatever the pod.
            ranked = tuple(k[:count] for k in keys(self, i))
            return np.lexsort((index_order, *reversed(ranked))).astype(np.int64)
        free = self.card_free[i, :count]
        values = self._value_order(i)
        position = {v: p for p, v in enumerate(values)}
        # Cards with the same free milli are interchangeable: lowest index first among them.
        rank = np.array([position.get(int(f), len(values)) for f in free.tolist()])
        return np.lexsort((index_order, rank)).astype(np.int64)

    def _value_order(self, i: int) -> tuple[int, ...]:
        if not self.track_states:  # no state ids to cache on (the engine has no workload)
            return self._search_order(i)
        sid = int(self.state_id[i])
        found = self._value_orders.get(sid)
        if found is None:
            found = self._search_order(i)
            self._value_orders[sid] = found
        return found

    def _search_order(self, i: int) -> tuple[int, ...]:
        """The order of row ``i``'s distinct free milli values (cards with none free left
        out) that minimises the expected cost of the next share's first fit, over the
        workload's share classes: the cost is our policy's card key for that share (cost
        bucket, then the free milli, as :meth:`KubegpuScorer.share_choice` ranks cards).
        Every order is tried up to :data:`MAX_SEARCHED_VALUES` values; beyond, best fit."""
        count = int(self.gpu_count[i])
        values = sorted({int(v) for v in self.card_free[i, :count].tolist() if v > 0})
        chooser = self.card_chooser
        if len(values) < 2 or not self.shares or not isinstance(chooser, WasteCards):
            return tuple(values)
        if len(values) > MAX_SEARCHED_VALUES:
            return tuple(values)
        scorer = chooser.scorer
        rows = np.array([i])
        candidates = np.array(values, dtype=np.int64)
        costs = np.empty((len(self.shares), len(values)))
        weights = np.array([w for _, w in self.shares])
        milli = np.array([pod.gpu_milli for pod, _ in self.shares])
        for k, (pod, _) in enumerate(self.shares):
            bucket = scorer.waste.share_buckets(
                scorer.waste_entry[rows],
                candidates[None, :],
                self.gpu_free_total[rows].astype(np.float64),
                self.cpu_free[rows].astype(np.float64),
                pod.gpu_milli,
                pod.cpu_milli,
            )[0]
            costs[k] = (
                np.where(candidates >= pod.gpu_milli, bucket, 0.0) * (2 * MILLI_PER_GPU + 2)
                + candidates
            )
        perms = np.array(list(itertools.permutations(range(len(values)))), dtype=np.int64)
        fits = candidates[perms][:, :, None] >= milli[None, None, :]  # perm × position × class
        first = fits.argmax(axis=1)  # perm × class: position of the first fit
        placed = fits.any(axis=1)
        chosen = np.take_along_axis(perms, first, axis=1)  # perm × class: value index taken
        cost = np.where(placed, costs[np.arange(len(self.shares))[None, :], chosen], 0.0)
        # permutations() starts at the ascending order, so best fit wins ties.
        best = int((cost @ weights).argmin())
        return tuple(values[int(j)] for j in perms[best])
