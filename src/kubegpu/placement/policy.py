"""What a placement policy is made of, as the engine uses it: a node scorer and a card chooser.

A policy is one :class:`PolicySpec` in the registry (:data:`kubegpu.placement.policies.
POLICIES`). The spec holds no scorer, only how to build one: each
:class:`~kubegpu.placement.engine.PlacementEngine` builds its policy's :class:`NodeScorer` and
:class:`CardChooser` once, over its own state (:class:`PolicyInputs`), because scorers keep
per-state tables (FGD's scores, our waste) that belong to one engine. The engine calls them
and nothing else differs between policies; the extender, the simulator and the CLIs read the
spec's flags for whether they offer the policy.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kubegpu.placement.fragmentation import ClassKey, TypicalWorkload
from kubegpu.placement.model import PodRequest
from kubegpu.placement.state import ClusterState, IntArray
from kubegpu.placement.waste import WasteWeights


@dataclass(frozen=True)
class PolicyInputs:
    """What one engine's scorers are built from.

    ``rng`` is the engine's one generator: a policy that draws for its node and its card (Random)
    draws both from it, in call order, so a seed replays the same placements."""

    state: ClusterState
    workload: TypicalWorkload | None  # the target workload; None where the caller has none
    rng: np.random.Generator
    waste_weights: WasteWeights | None  # our policy's constants (only benchmarks vary them)


class NodeScorer(Protocol):
    """How a policy ranks the feasible nodes for one pod."""

    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray:
        """An integer score 0…100 (higher is better) of each of ``rows``: feasible, at least one."""
        ...

    def choose(self, pod: PodRequest, rows: IntArray) -> tuple[int, int]:
        """The position in ``rows`` (tie-break order) of the best node, and its score."""
        ...


class ScoredNodes(abc.ABC):
    """A node scorer whose best node is its highest score."""

    @abc.abstractmethod
    def scores(self, pod: PodRequest, rows: IntArray) -> IntArray: ...

    def choose(self, pod: PodRequest, rows: IntArray) -> tuple[int, int]:
        scores = self.scores(pod, rows)
        best = int(scores.argmax())  # first maximum = smallest rank among the best
        return best, int(scores[best])


class CardChooser(Protocol):
    """How a policy picks a share's card on the chosen node (whole cards are the engine's)."""

    def choose(self, i: int, pod: PodRequest) -> tuple[int, ...]:
        """Card columns of row ``i`` for ``pod``, a share that fits there."""
        ...


# A comparator of one row's cards alone: the keys to sort them by, smallest first.
CardKeys = Callable[[ClusterState, int], tuple[IntArray, ...]]
# Builds an engine's node scorer from its inputs.
ScorerFactory = Callable[[PolicyInputs], NodeScorer]
# Builds an engine's card chooser from its inputs and the node scorer built for the same engine
# (FGD's and our card choice are their node scorer's own).
ChooserFactory = Callable[[PolicyInputs, NodeScorer], CardChooser]
# A policy's target workload from one class key per pod (kubegpu.placement.target).
TargetRule = Callable[[Sequence[ClassKey]], TypicalWorkload]


@dataclass(frozen=True)
class CardRule:
    """A way of choosing a share's card, as the registry holds it.

    ``keys`` is set where the choice is an ordering of the cards alone: a DRA driver can
    publish that order, and the allocator's first fit is then the policy's choice.
    ``searched_order``: no such ordering, but :mod:`kubegpu.placement.device_order` searches
    the order that serves the choice best (ours, by waste). A choice with neither (FGD's,
    Random's) ranks nothing a driver could publish."""

    name: str  # in messages: "fgd chooses cards by fragmentation"
    build: ChooserFactory
    keys: CardKeys | None = None
    searched_order: bool = False

    @property
    def publishable(self) -> bool:
        """Whether a DRA driver can steer the allocator to this choice (``steered``)."""
        return self.keys is not None or self.searched_order


@dataclass(frozen=True)
class PolicySpec:
    """One registered policy: its names, how it scores and chooses, and who offers it.

    Every registered policy is accepted wherever a policy is named (the extender's
    ``--policy`` and settings file, ``kubegpu simulate --policy``); the flags say where it is
    also listed."""

    name: str  # CLI and config name, e.g. "fgd"
    label: str  # the paper artifact's label, e.g. "06-FGD" (get_policy accepts it too)
    node_scorer: ScorerFactory
    cards: CardRule
    target: TargetRule  # the workload it measures against (built for every policy alike)
    needs_workload: bool = False  # the engine refuses to build it without a target workload
    # The name the extender lists it under (its --policy help, the config docs, the Helm chart),
    # e.g. "binpack" for bestfit; None: not listed there.
    extender_name: str | None = None
    # Run by ``kubegpu simulate --policy all`` and listed in that option's help.
    in_simulator_all: bool = False
