"""Which cards of the chosen node a pod gets: whole cards for every policy, and for a share the
card rules that need no scorer (a comparator, or a random draw).

Whole cards: every policy takes the lowest-index fully free cards of an allowed model. A share
goes to one card: for a comparator (:data:`BEST_FIT`, :data:`SPREAD`), the eligible card whose
sort key (most significant first) is smallest, the lowest index breaking the remaining ties, as
NVIDIA's device plugin orders devices with a comparator per policy. The random draw is
:data:`RANDOM`. The two choices that price the state after placement (FGD's fragmentation, our
waste) are not orderings of the cards alone; their rules live with their scorers
(:mod:`.fgd`, :mod:`.kubegpu`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kubegpu.placement.feasibility import eligible_cards
from kubegpu.placement.model import MILLI_PER_GPU, PodRequest
from kubegpu.placement.policy import CardChooser, CardKeys, CardRule, NodeScorer, PolicyInputs
from kubegpu.placement.state import ClusterState, IntArray


def lowest_full_cards(state: ClusterState, i: int, pod: PodRequest) -> tuple[int, ...]:
    """The lowest-index fully free cards of an allowed model, as many as ``pod`` takes."""
    full = state.card_free[i] == MILLI_PER_GPU
    if pod.gpu_models:
        cards = state.model_selection(pod.gpu_models).cards
        if cards is not None:
            full &= cards[i]
    return tuple(int(c) for c in np.flatnonzero(full)[: pod.gpu_count])


def eligible_row(state: ClusterState, i: int, pod: PodRequest) -> npt.NDArray[np.bool_]:
    """Which card columns of row ``i`` ``pod`` fits on now."""
    row: npt.NDArray[np.bool_] = eligible_cards(state, np.array([i]), pod)[0]
    return row


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


class KeyedCards:
    """The eligible card that sorts first by ``keys``."""

    def __init__(self, state: ClusterState, keys: CardKeys) -> None:
        self.state = state
        self.keys = keys

    def choose(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        return (first_by_keys(self.keys(self.state, i), eligible_row(self.state, i, pod)),)


class RandomCard:
    """A uniformly drawn eligible card."""

    def __init__(self, state: ClusterState, rng: np.random.Generator) -> None:
        self.state = state
        self.rng = rng

    def choose(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        return (random_card(self.rng, eligible_row(self.state, i, pod)),)


def keyed_rule(name: str, keys: CardKeys) -> CardRule:
    """The card rule of a comparator (a DRA driver can publish its order as is)."""

    def build(inputs: PolicyInputs, _scorer: NodeScorer) -> CardChooser:
        return KeyedCards(inputs.state, keys)

    return CardRule(name, build, keys=keys)


# BestFit: the tightest fit, i.e. the least free milli.
BEST_FIT = keyed_rule("best-fit", lambda state, i: (state.card_free[i],))
# Spread: the emptiest card, most free milli then most free memory (a card whose memory is not
# tracked counts as having the most).
SPREAD = keyed_rule("spread", lambda state, i: (-state.card_free[i], -state.card_memory[i]))
RANDOM = CardRule("random", lambda inputs, _scorer: RandomCard(inputs.state, inputs.rng))
