"""Dense memory-only packing: what each card-choice rule trades between first refusal and pods
placed.

Issue 32 asks kubegpu to beat gpushare's best case (first fit over nodes in name order, then
the card with the least free memory that fits) on two counts at once for pods asking GPU
memory alone, packed far past capacity: the arrival index of the first pod refused, and the
pods placed in all. This script asks whether any rule can, in a model with nothing but card
gaps: ``--nodes`` nodes of ``--cards`` cards, each holding ``--card-gib`` whole GiB (an 80 GB
card's 81,559 MiB hold 79 whole GiB), pods of whole GiB placed in arrival order, every pod
that fits somewhere placed (a scheduler does not hold a pod back to keep room). CPU is ample
and cards are alike, so the only choice is the card. Rules:

* ``peer``: the first node in name order with a card that fits, then its card with the least
  free memory that fits (gpushare's ``allocateGPUID`` under first-fit node choice);
* ``best-fit``: the card with the least free memory that fits, in the whole cluster (what
  kubegpu's policy does with such pods, ties by rank: ``bench/memory_only_replay.py``'s
  ``dense`` row gives the engine the same first refusals and pod counts);
* ``first-fit``: the first card that fits, nodes and cards in order;
* ``worst-fit``: the card with the most free memory;
* ``sum-of-squares``: the card whose new gap keeps the cluster's count of cards per gap size
  most even (Csirik et al., "On the sum-of-squares algorithm for bin packing", 2006:
  minimise the sum over gap sizes of the squared number of partly filled cards with that
  gap), ties by least free memory.

    .venv/bin/python bench/dense_objectives.py [--seeds 42-61] [--sizes 1-40] [--pods 2000]
    .venv/bin/python bench/dense_objectives.py --seeds 42-44 --replay-draw

Sizes are bands as in ``bench/peer_gpushare.py`` (``--sizes 1-8:4,9-24:3,25-40:2,41-79:1`` is
its default); each seed draws one arrival order, the same for every rule. Prints, per rule,
the means over the seeds of the first refusal, the pods placed and the memory held at the
end, and on how many seeds the rule beats ``peer`` on each count. Nothing here is tuned: the
rules are textbook ones, none with a constant.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from memory_only_replay import dense_sizes, seed_list
from peer_gpushare import SizeBand, draw_sizes, parse_sizes

IntArray = npt.NDArray[np.int64]


@dataclass
class Cluster:
    """Every card's free whole GiB, and how many partly filled cards have each gap size."""

    nodes: int
    cards: int
    card_gib: int

    def __post_init__(self) -> None:
        self.gaps: IntArray = np.full(self.nodes * self.cards, self.card_gib, dtype=np.int64)
        self.partial: IntArray = np.zeros(self.card_gib + 1, dtype=np.int64)

    def is_partial(self, gaps: IntArray) -> npt.NDArray[np.bool_]:
        return (gaps > 0) & (gaps < self.card_gib)

    def take(self, card: int, gib: int) -> None:
        before = int(self.gaps[card])
        after = before - gib
        if 0 < before < self.card_gib:
            self.partial[before] -= 1
        if 0 < after < self.card_gib:
            self.partial[after] += 1
        self.gaps[card] = after


Rule = Callable[[Cluster, IntArray, int], int]  # (cluster, cards that fit, GiB) -> card


def peer(cluster: Cluster, fits: IntArray, gib: int) -> int:
    node = fits[0] // cluster.cards
    on_node = fits[fits // cluster.cards == node]
    return int(on_node[np.argmin(cluster.gaps[on_node])])


def best_fit(cluster: Cluster, fits: IntArray, gib: int) -> int:
    return int(fits[np.argmin(cluster.gaps[fits])])


def first_fit(cluster: Cluster, fits: IntArray, gib: int) -> int:
    return int(fits[0])


def worst_fit(cluster: Cluster, fits: IntArray, gib: int) -> int:
    return int(fits[np.argmax(cluster.gaps[fits])])


def sum_of_squares(cluster: Cluster, fits: IntArray, gib: int) -> int:
    before = cluster.gaps[fits]
    after = before - gib
    # The change of sum(N(g)^2) when one card moves from gap `before` to gap `after` (g > 0
    # and below a whole card count; the two differ since gib >= 1).
    leaving = np.where(cluster.is_partial(before), 1 - 2 * cluster.partial[before], 0)
    arriving = np.where(cluster.is_partial(after), 1 + 2 * cluster.partial[after], 0)
    cost = leaving + arriving
    cheapest = fits[cost == cost.min()]
    return int(cheapest[np.argmin(cluster.gaps[cheapest])])


RULES: dict[str, Rule] = {
    "peer": peer,
    "best-fit": best_fit,
    "first-fit": first_fit,
    "worst-fit": worst_fit,
    "sum-of-squares": sum_of_squares,
}


@dataclass(frozen=True)
class Outcome:
    first_refusal: int  # arrival index; the pod count when none was refused
    placed: int
    held_pct: float  # of all cards' whole GiB


def pack(sizes: Sequence[int], rule: Rule, nodes: int, cards: int, card_gib: int) -> Outcome:
    cluster = Cluster(nodes, cards, card_gib)
    placed, first = 0, None
    for k, gib in enumerate(sizes):
        fits = np.flatnonzero(cluster.gaps >= gib)
        if fits.size == 0:
            first = k if first is None else first
            continue
        cluster.take(rule(cluster, fits, gib), gib)
        placed += 1
    total = nodes * cards * card_gib
    held = 100 * (total - int(cluster.gaps.sum())) / total
    return Outcome(len(sizes) if first is None else first, placed, held)


def draw(bands: Sequence[SizeBand], pods: int, seed: int, like_replay: bool) -> list[int]:
    if like_replay:
        return dense_sizes(seed, pods, bands[0].low, bands[0].high)
    return draw_sizes(bands, pods, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-61")
    parser.add_argument("--sizes", default="1-40", help="LOW-HIGH:WEIGHT,... in GiB")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--card-gib", type=int, default=79)
    parser.add_argument(
        "--replay-draw",
        action="store_true",
        help="draw one uniform band as memory_only_replay.py's dense row does (numpy), to "
        "check this model against the engine's figures there",
    )
    args = parser.parse_args()
    try:
        bands = parse_sizes(args.sizes)
        if args.replay_draw and len(bands) != 1:
            raise ValueError("--replay-draw: one band only (memory_only_replay.py draws 1-40)")
    except ValueError as exc:
        parser.error(str(exc))
    if max(b.high for b in bands) > args.card_gib:
        parser.error(f"--sizes: a pod over --card-gib ({args.card_gib}) never fits")
    seeds = seed_list(parser, args.seeds)
    runs: dict[str, list[Outcome]] = {name: [] for name in RULES}
    for seed in seeds:
        sizes = draw(bands, args.pods, seed, args.replay_draw)
        for name, rule in RULES.items():
            runs[name].append(pack(sizes, rule, args.nodes, args.cards, args.card_gib))
    count = len(runs["peer"])
    print(f"{args.nodes} nodes x {args.cards} cards of {args.card_gib} GiB, {args.pods} pods "
          f"of {args.sizes} GiB, seeds {args.seeds}")  # fmt: skip
    print()
    print("| rule | first refusal | pods placed | memory held | first refusal later than peer "
          "| more pods placed than peer |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for name, outcomes in runs.items():
        later = sum(
            o.first_refusal > p.first_refusal for o, p in zip(outcomes, runs["peer"], strict=True)
        )
        more = sum(o.placed > p.placed for o, p in zip(outcomes, runs["peer"], strict=True))
        print(
            f"| {name} | {np.mean([o.first_refusal for o in outcomes]):.1f} "
            f"| {np.mean([o.placed for o in outcomes]):.1f} "
            f"| {np.mean([o.held_pct for o in outcomes]):.2f} % "
            f"| {later} of {count} | {more} of {count} |"
        )


if __name__ == "__main__":
    main()
