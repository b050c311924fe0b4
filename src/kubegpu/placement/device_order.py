"""Card choice as DRA's allocator makes it: the first device in slice order that fits.

Under Dynamic Resource Allocation the scheduler's allocator, not a scorer, picks the device: it
walks the node's pool in slice order and takes the first device with enough free capacity (for
consumable capacity, the first whose remaining memory and compute cover the request), and
Kubernetes has no device scoring yet (KEP-4970). A scheduler extender can still rank *nodes*;
the card is out of its hands. :class:`DeviceOrderEngine` models that: the node is the policy's
choice, as today, and the card is the first fit in a device order. (The engine's own card
choice is the policy's, :mod:`kubegpu.placement.engine`; this is its DRA variant, beside it.)

* ``first-fit``: the order our driver publishes, device (GPU) index order.
* ``steered``: the order a driver could publish to steer first fit, re-published whenever the
  node's allocations change. For a policy whose card rule is a comparator (BestFit, Spread;
  :attr:`CardRule.keys <kubegpu.placement.policy.CardRule.keys>`) that comparator's order,
  which makes first fit the policy's choice. For ours: the order of
  the node's cards (by free milli) that minimises the expected cost of the *next* share's first
  fit over the workload's share classes, the cost being our own card key for that share
  (:meth:`DeviceOrderEngine._search_order`). One order cannot suit every share size, so this
  recovers only part of what first fit loses (docs/benchmarks.md, "Placement quality under
  DRA", also says what the driver and the extender would have to do).

Either way the allocator's accounting stays the authority: a card is taken only if the pod
fits it now (:func:`~kubegpu.placement.feasibility.eligible_cards`), the order only says which
of the fitting cards comes first, so no order can over-commit a card.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from kubegpu.placement.engine import PlacementEngine
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
    ) -> None:
        super().__init__(nodes, policy, workload, seed=seed, waste_weights=waste_weights)
        if card_choice is CardChoice.STEERED:
            check_steerable(self.policy)
        self.card_choice = card_choice
        self.shares = share_classes(workload)
        # Per node state (free CPU, free milli per card, model): the published order of the
        # distinct free milli values, so each state's order is searched once.
        self._value_orders: dict[int, tuple[int, ...]] = {}

    def pick_columns(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        if self.card_choice is CardChoice.POLICY or pod.gpu_count == 0:
            return super().pick_columns(i, pod)
        eligible = self._eligible_row(i, pod)[: self.gpu_count[i]]
        return first_fit(self.device_order(i), eligible, pod.gpu_count)

    def device_order(self, i: int) -> IntArray:
        """Row ``i``'s card columns in the order its ResourceSlice lists them now."""
        count = int(self.gpu_count[i])
        index_order = np.arange(count, dtype=np.int64)
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
