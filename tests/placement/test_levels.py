"""A share is scored by what it holds of a card: memory for a memory-only share, compute for a
compute-only one, the larger of the two when it asks both (issue 32: memory-only shares were
ranked by their 1 milli of compute, every node alike)."""

from __future__ import annotations

import numpy as np
import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import class_key
from kubegpu.placement.model import GpuState, NodeState, PodRequest, card_level, share_milli
from kubegpu.placement.policies import POLICIES, get_policy
from kubegpu.placement.target import reference_card_memory, target_workload

CARD = 81920  # MiB
GIB = 1024


def memory_share(gib: int, name: str = "p") -> PodRequest:
    """A pod as gpushare's compat mode reads it: memory alone, 1 milli of compute."""
    return PodRequest(1000, 1024, 1, 1, gib * GIB, name=name)


def node(name: str, free_gib: list[int], *, total: int | None = CARD, rank: int = 0) -> NodeState:
    """A node whose cards have ``free_gib`` free (and 1 milli of compute held per card used)."""
    gpus = tuple(
        GpuState(j, 1000 if g * GIB == CARD else 990, g * GIB, "", total)
        for j, g in enumerate(free_gib)
    )
    return NodeState(name, 64000, 64000, 1 << 20, "A100", gpus, rank=rank)


def test_a_share_weighs_the_larger_of_its_compute_and_memory_fractions() -> None:
    assert share_milli(1, 40 * GIB, CARD) == 500  # memory only: its memory
    assert share_milli(300, None, CARD) == 300  # compute only
    assert share_milli(300, 8 * GIB, CARD) == 300  # both: compute is the larger
    assert share_milli(100, 20 * GIB, CARD) == 250  # both: memory is the larger
    assert share_milli(1, 40 * GIB, None) == 1  # card memory unknown: compute alone
    assert share_milli(1, CARD, CARD) == 999  # still a share, never a whole card
    # Rounded down on both sides, so memory that fits is never a level that does not.
    assert card_level(1000, 27306, CARD) >= share_milli(1, 27306, CARD)


def test_a_cards_level_is_the_smaller_of_its_free_compute_and_memory() -> None:
    assert card_level(990, 20 * GIB, CARD) == 250
    assert card_level(200, 60 * GIB, CARD) == 200
    assert card_level(700, 20 * GIB, None) == 700
    assert card_level(700, None, CARD) == 700


def test_without_card_memory_levels_are_the_compute_array_itself() -> None:
    engine = PlacementEngine([node("a", [80, 40], total=None)], "bestfit")
    assert not engine.levels_memory
    assert engine.card_free is engine.card_compute
    levelled = PlacementEngine([node("a", [80, 40])], "bestfit")
    assert levelled.levels_memory
    assert levelled.card_free[0].tolist() == [1000, 500]
    assert levelled.card_compute[0].tolist() == [1000, 990]


@pytest.mark.parametrize("total, distinct", [(CARD, True), (None, False)])
def test_binpack_ranks_memory_only_shares_by_memory(total: int | None, distinct: bool) -> None:
    nodes = [
        node("roomy", [70, 80], total=total, rank=0),
        node("tight", [12, 80], total=total, rank=1),
        node("middle", [40, 80], total=total, rank=2),
    ]
    engine = PlacementEngine(nodes, "bestfit")
    pod = memory_share(10)
    rows = engine.feasible_rows(pod)
    scores = engine.scores(pod, rows).tolist()
    if distinct:
        # The fullest card that fits wins: the pod's memory is what it is packed by.
        assert len(set(scores)) == 3
        placed = engine.place(pod)
        assert placed is not None and placed.node == "tight" and placed.gpu_indices == (0,)
    else:
        # Without the cards' memory the share is its 1 milli: the ranking cannot tell them apart
        # (what issue 32 measured), though free memory is still checked.
        assert len(set(scores)) == 1


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_places_memory_only_shares_soundly(policy: str) -> None:
    nodes = [node(f"n{i}", [80, 80, 80, 80], rank=i) for i in range(3)]
    pods = [memory_share(g, f"p{k}") for k, g in enumerate([30, 50, 20, 40, 10, 70, 25, 35] * 3)]
    spec = get_policy(policy)
    workload = target_workload(spec, [class_key(p, card_memory_mib=CARD) for p in pods])
    engine = PlacementEngine(nodes, spec, workload)
    placed = [engine.place(p) for p in pods]
    # Memory is never over-committed, and each card's level matches what it holds.
    assert (engine.card_memory[:, :4] >= 0).all()
    assert (engine.card_free[:, :4] == engine.card_memory[:, :4] * 1000 // CARD).all()
    held = 3 * 4 * CARD - int(engine.card_memory[:, :4].sum())
    assert held == sum(p.gpu_memory_mib or 0 for p, at in zip(pods, placed, strict=True) if at)


def test_fgd_and_ours_see_memory_only_shares_fragment_a_card() -> None:
    # A workload of 30 GiB shares: a card with 35 GiB free fits one, one with 25 GiB none.
    pods = [memory_share(30, f"w{k}") for k in range(10)]
    nodes = [node("a", [45], rank=0), node("b", [55], rank=1)]
    for policy in ("fgd", "kubegpu"):
        spec = get_policy(policy)
        workload = target_workload(spec, [class_key(p, card_memory_mib=CARD) for p in pods])
        engine = PlacementEngine(nodes, spec, workload)
        pod = memory_share(20)
        # On a: 45 -> 25 GiB strands 25; on b: 55 -> 35 GiB keeps room for one more.
        placed = engine.choose(pod)
        assert placed is not None and placed.node == "b", policy


def test_a_share_scored_at_its_level_on_cards_of_different_memory() -> None:
    small = NodeState(
        "small", 64000, 64000, 1 << 20, "T4", (GpuState(0, 990, 10 * GIB, "", 16 * GIB),), rank=0
    )
    big = node("big", [40], rank=1)
    engine = PlacementEngine([small, big], "bestfit")
    pod = memory_share(8)
    rows = engine.feasible_rows(pod)
    assert engine.share_levels(pod, rows).tolist() == [500, 100]
    groups, left = engine.levelled(pod, rows)
    assert len(groups) == 2 and left.size == 0
    # 10 -> 2 GiB of 16 on the small card is the tighter fit than 40 -> 32 of 80.
    placed = engine.choose(pod)
    assert placed is not None and placed.node == "small"


def test_a_pod_that_fits_as_asked_but_not_at_its_level_is_still_placed() -> None:
    # A compute-only share on a card whose memory others hold: its level there is 0, yet the
    # pod asks no memory and fits; the policies cannot score it, the engine still places it.
    full = NodeState("full", 64000, 64000, 1 << 20, "A100", (GpuState(0, 800, 0, "", CARD),))
    engine = PlacementEngine([full], "kubegpu", target_workload(get_policy("kubegpu"), []))
    pod = PodRequest(1000, 1024, 1, 300, None, name="compute-only")
    rows = engine.feasible_rows(pod)
    assert rows.tolist() == [0]
    _, left = engine.levelled(pod, rows)
    assert left.tolist() == [0]
    assert engine.scores(pod, rows).tolist() == [0]
    placed = engine.place(pod)
    assert placed is not None and placed.gpu_indices == (0,)
    assert engine.card_compute[0, 0] == 500


def test_memory_that_fits_exactly_passes_and_one_mib_more_does_not() -> None:
    engine = PlacementEngine([node("a", [27])], "bestfit")
    exact = PodRequest(1000, 1024, 1, 1, 27 * GIB)
    over = PodRequest(1000, 1024, 1, 1, 27 * GIB + 1)
    assert engine.feasible_rows(exact).tolist() == [0]
    assert engine.feasible_rows(over).tolist() == []
    assert engine.place(exact) is not None


def test_the_workload_classes_shares_at_their_level_on_the_most_common_card() -> None:
    assert reference_card_memory([CARD, CARD, 16 * GIB, None]) == CARD
    assert reference_card_memory([CARD, 16 * GIB]) == 16 * GIB  # a tie: the smaller
    assert reference_card_memory([None, None]) is None
    pod = memory_share(40)
    assert class_key(pod, card_memory_mib=CARD) == (1000, 500, 1, "")
    assert class_key(pod) == (1000, 1, 1, "")  # memory unknown: by compute, as the traces
    whole = PodRequest(1000, 1024, 2, 1000, None)
    assert class_key(whole, card_memory_mib=CARD) == (1000, 1000, 2, "")


def test_levels_never_change_a_placement_where_no_card_memory_is_known() -> None:
    # The traces: cards without memory, shares by compute. Same engine, same choices.
    rng = np.random.default_rng(7)
    nodes = [node(f"n{i}", [80] * 4, total=None, rank=i) for i in range(4)]
    plain = [
        NodeState(n.name, n.cpu_capacity_milli, n.cpu_free_milli, n.memory_free_mib, "A100",
                  tuple(GpuState(g.index) for g in n.gpus), rank=n.rank)
        for n in nodes
    ]  # fmt: skip
    pods = [PodRequest(1000, 1024, 1, int(m), name=f"p{k}") for k, m in
            enumerate(rng.integers(50, 900, 20))]  # fmt: skip
    a = PlacementEngine(nodes, "bestfit")
    b = PlacementEngine(plain, "bestfit")
    assert [a.place(p) for p in pods] == [b.place(p) for p in pods]
