"""Which cards of the chosen node a pod gets: whole cards for every policy, and for a share a
table of comparators, one per :class:`~kubegpu.placement.policies.GpuChoice`.

Whole cards: every policy takes the lowest-index fully free cards of an allowed model. A share
goes to one card: the eligible card whose sort key (:data:`CARD_KEYS`, most significant
first) is smallest, the lowest index breaking the remaining ties, as NVIDIA's device plugin
orders devices with a comparator per policy. The random draw and the two choices that price
the state after placement (FGD's fragmentation, our waste) are not orderings of the cards
alone; the engine asks their scorers (:mod:`.fgd`, :mod:`.kubegpu`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policies import GpuChoice
from kubegpu.placement.state import ClusterState, IntArray

# Per card column of one row: the keys to sort eligible cards by, smallest first.
CardKeys = Callable[[ClusterState, int], tuple[IntArray, ...]]

CARD_KEYS: dict[GpuChoice, CardKeys] = {
    # BestFit: the tightest fit, i.e. the least free milli.
    GpuChoice.BEST_FIT: lambda state, i: (state.card_free[i],),
    # Spread: the emptiest card, most free milli then most free memory (a card whose memory
    # is not tracked counts as having the most).
    GpuChoice.SPREAD: lambda state, i: (-state.card_free[i], -state.card_memory[i]),
}


def lowest_full_cards(state: ClusterState, i: int, pod: PodRequest) -> tuple[int, ...]:
    """The lowest-index fully free cards of an allowed model, as many as ``pod`` takes."""
    full = state.card_free[i] == MILLI_PER_GPU
    if pod.gpu_models:
        cards = state.model_selection(pod.gpu_models).cards
        if cards is not None:
            full &= cards[i]
    return tuple(int(c) for c in np.flatnonzero(full)[: pod.gpu_count])


def first_by_keys(keys: tuple[IntArray, ...], eligible: npt.NDArray[np.bool_]) -> int:
    """Column of the eligible card with the smallest keys (lowest column on ties); at least
    one card must be eligible."""
    if len(keys) == 1:
        # One key: a masked argmin, the first (lowest-index) of the smallest.
        masked = np.where(eligible, keys[0], np.iinfo(np.int64).max)
        return int(masked.argmin())
    cols = np.flatnonzero(eligible)
    # lexsort sorts by the last key first and is stable: the column breaks the last ties.
    order = np.lexsort(tuple(key[cols] for key in reversed(keys)))
    return int(cols[order[0]])


def random_card(rng: np.random.Generator, eligible: npt.NDArray[np.bool_]) -> int:
    cols = np.flatnonzero(eligible)
    return int(cols[int(rng.integers(cols.size))])
