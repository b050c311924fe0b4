"""Each policy on small clusters where the right node and card are obvious by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.policies import POLICIES, get_policy

WHOLE_CARD_WORKLOAD = TypicalWorkload.from_pods([PodRequest(1000, 0, 1, 1000)])


def node(
    name: str,
    free: tuple[int, ...],
    cpu_free: int = 64_000,
    rank: int = 0,
    model: str = "T4",
    tags: dict[str, int] | None = None,
    memory: tuple[int, ...] | None = None,
) -> NodeState:
    gpus = tuple(GpuState(i, f, None if memory is None else memory[i]) for i, f in enumerate(free))
    return NodeState(name, 64_000, cpu_free, 256_000, model, gpus, rank, tags or {})


def share(milli: int, cpu: int = 1000, **kw: object) -> PodRequest:
    return PodRequest(cpu, 1024, 1, milli, **kw)  # type: ignore[arg-type]


def engine(
    nodes: list[NodeState], policy: str, workload: TypicalWorkload | None = None
) -> PlacementEngine:
    return PlacementEngine(nodes, policy, workload or WHOLE_CARD_WORKLOAD, seed=7)


def test_best_fit_takes_the_node_with_least_left_after_placement() -> None:
    nodes = [node("roomy", (1000, 1000)), node("tight", (1000, 200), cpu_free=4000)]
    placement = engine(nodes, "bestfit").choose(share(200))
    assert placement is not None
    assert (placement.node, placement.gpu_indices) == ("tight", (1,))


def test_best_fit_scores_are_min_max_normalised_over_feasible_nodes() -> None:
    nodes = [node("roomy", (1000, 1000)), node("tight", (1000, 200), cpu_free=4000)]
    assert engine(nodes, "bestfit").score(share(200)) == {"roomy": 0, "tight": 100}


def test_dot_prod_prefers_the_fullest_node_along_the_requested_dimensions() -> None:
    nodes = [node("empty", (1000,) * 8), node("busy", (1000, 0, 0, 0), cpu_free=8000)]
    scores = engine(nodes, "dotprod").score(PodRequest(8000, 0, 1, 1000))
    # dot = 64000/128000·8000/128000 + 8000/8000·1000/8000 = 0.15625 → 100·(1 − 0.078125) = 92
    assert scores["empty"] == 92
    assert scores["busy"] > scores["empty"]


def test_gpu_packing_prefers_a_partly_used_card_then_a_used_node_then_an_idle_node() -> None:
    nodes = [
        node("idle", (1000,) * 8, rank=0),
        node("used-node", (1000, 0), rank=1),
        node("shared-card", (1000, 600), rank=2),
    ]
    scores = engine(nodes, "gpupacking").score(share(500))
    # idle 8-card node: max(33 − 8, 8) = 25; new card on a used node: 50 − 1 = 49;
    # shared card with 600 free: 100 − (60 div 10) = 94.
    assert scores == {"idle": 25, "used-node": 49, "shared-card": 94}


def test_gpu_packing_gives_cpu_only_pods_zero_so_rank_decides() -> None:
    nodes = [node("b", (1000,), rank=1), node("a", (0,), rank=0)]
    placement = engine(nodes, "gpupacking").choose(PodRequest(1000, 1024))
    assert placement is not None and placement.node == "a"


def test_gpu_clustering_joins_nodes_hosting_only_the_same_pod_class() -> None:
    nodes = [
        node("mixed", (1000, 500), rank=0, tags={"share-gpu": 1, "1-gpu": 1}),
        node("same", (1000, 500), rank=1, tags={"share-gpu": 1}),
        node("other", (1000, 500), rank=2, tags={"1-gpu": 1}),
        node("idle", (1000, 1000), rank=3),
    ]
    scores = engine(nodes, "gpuclustering").score(share(300))
    used = 25 * (8000 - 1500) // 8000  # = 20
    assert scores == {
        "mixed": 50 + used,
        "same": 75 + used,
        "other": used,
        "idle": 25 + 25 * 6000 // 8000,
    }


def test_fgd_fills_an_already_fragmented_card_instead_of_breaking_a_whole_one() -> None:
    # The target workload only has whole-card pods, so 600 free milli on a card is fragment.
    nodes = [node("whole", (1000,), rank=0), node("fragmented", (600,), rank=1)]
    eng = engine(nodes, "fgd")
    scores = eng.score(share(300))
    # fragmented: F 600 → 300, score trunc(100·σ(0.3)) = 57; whole: F 0 → 700, σ(−0.7) → 33.
    assert scores == {"whole": 33, "fragmented": 57}
    assert eng.choose(share(300)) is not None
    assert eng.place(share(300)).node == "fragmented"  # type: ignore[union-attr]


def test_fgd_picks_the_card_that_leaves_the_least_fragment_within_a_node() -> None:
    nodes = [node("n", (1000, 700, 1000))]
    assert engine(nodes, "fgd").pick_gpus("n", share(700)) == (1,)


def test_random_only_ever_picks_feasible_nodes_and_spreads_over_them() -> None:
    nodes = [node("a", (1000,)), node("b", (1000,)), node("full", (0,))]
    eng = engine(nodes, "random")
    picks = Counter(eng.choose(share(500)).node for _ in range(200))  # type: ignore[union-attr]
    assert set(picks) == {"a", "b"}
    assert min(picks.values()) > 50


def test_equal_scores_go_to_the_smallest_rank_whatever_the_input_order() -> None:
    nodes = [node("zz", (1000,), rank=0), node("aa", (1000,), rank=5)]
    for policy in ("dotprod", "gpupacking", "bestfit", "fgd", "gpuclustering"):
        placement = engine(list(reversed(nodes)), policy).choose(share(250))
        assert placement is not None and placement.node == "zz", policy


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_whole_card_pods_take_the_lowest_index_free_cards(policy: str) -> None:
    nodes = [node("n", (1000, 300, 1000, 1000))]
    assert engine(nodes, policy).pick_gpus("n", PodRequest(2000, 0, 2, 1000)) == (0, 2)


@pytest.mark.parametrize("policy", ["dotprod", "gpuclustering", "gpupacking", "bestfit"])
def test_best_fit_card_choice_takes_the_tightest_card_lowest_index_on_ties(policy: str) -> None:
    nodes = [node("n", (1000, 400, 300, 300))]
    assert engine(nodes, policy).pick_gpus("n", share(250)) == (2,)


def test_policy_lookup_accepts_cli_names_and_paper_labels() -> None:
    assert get_policy("06-FGD") is get_policy("fgd") is get_policy("FGD")
    with pytest.raises(KeyError, match="unknown policy"):
        get_policy("tetris")


def test_kubegpu_sends_cpu_only_pods_where_the_cards_are_already_used() -> None:
    # Both nodes keep fragment 0 after the pod; FGD would take rank 0 and spend CPU next to
    # two free cards, ours spends it on the node whose cards are all allocated.
    nodes = [node("free-cards", (1000, 1000), rank=0), node("cards-used", (0, 0), rank=1)]
    cpu_pod = PodRequest(4000, 1024)
    assert engine(nodes, "fgd").choose(cpu_pod).node == "free-cards"  # type: ignore[union-attr]
    assert engine(nodes, "kubegpu").choose(cpu_pod).node == "cards-used"  # type: ignore[union-attr]


def test_kubegpu_closes_a_gap_rather_than_opening_a_card_best_node_100() -> None:
    # No share size is common in a whole-card workload, so every gap is waste: the share
    # shrinks the 600 gap on "fragmented" (−300) instead of opening a 700 gap on "whole".
    nodes = [node("whole", (1000,), rank=0), node("fragmented", (600,), rank=1)]
    assert engine(nodes, "kubegpu").score(share(300)) == {"whole": 0, "fragmented": 100}


def test_kubegpu_breaks_equal_waste_by_the_tightest_card() -> None:
    # Cards 1 and 2 both shrink their unfillable gap by 300; FGD takes the first (index 1),
    # we take the tighter one (600 free) and keep the 700 for a bigger share.
    nodes = [node("n", (1000, 700, 600))]
    assert engine(nodes, "fgd").pick_gpus("n", share(300)) == (1,)
    assert engine(nodes, "kubegpu").pick_gpus("n", share(300)) == (2,)


def test_kubegpu_keeps_a_whole_card_free_for_a_rare_whole_card_class() -> None:
    # 19 half-card shares and one whole-card pod: FGD's target (classes covering 95 % of pods)
    # drops the whole-card class, so both nodes score 50 for a share and rank 0 wins, breaking
    # its only whole card. Ours dooms no waste on either (a 500 gap is a common share's size),
    # then fits best: the share closes the 500-free card on "two-cards".
    from kubegpu.simulate.replay import target_workload

    trace = [PodRequest(1000, 1024, 1, 500)] * 19 + [PodRequest(1000, 1024, 1, 1000)]
    nodes = [node("one-card", (1000,), rank=0), node("two-cards", (1000, 500), rank=1)]
    fgd_engine = PlacementEngine(nodes, "fgd", target_workload(get_policy("fgd"), trace))
    ours = PlacementEngine(nodes, "kubegpu", target_workload(get_policy("kubegpu"), trace))
    assert fgd_engine.choose(share(500)).node == "one-card"  # type: ignore[union-attr]
    assert ours.choose(share(500)).node == "two-cards"  # type: ignore[union-attr]
    assert ours.pick_gpus("two-cards", share(500)) == (1,)
    assert ours.score(share(500)) == {"one-card": 0, "two-cards": 100}


def test_kubegpu_scores_whole_card_pods_against_the_popular_classes_only() -> None:
    # A rare two-card class (1 of 20 pods): for one-card pods ours, like FGD, ignores it, so
    # both nodes keep fragment 0 and rank 0 wins; the whole-workload measure would have kept
    # the pair on "pair" free.
    from kubegpu.simulate.replay import target_workload

    trace = [PodRequest(1000, 1024, 1, 1000)] * 19 + [PodRequest(1000, 1024, 2, 1000)]
    nodes = [node("pair", (1000, 1000), rank=0), node("three", (1000, 1000, 1000), rank=1)]
    ours = PlacementEngine(nodes, "kubegpu", target_workload(get_policy("kubegpu"), trace))
    assert ours.choose(PodRequest(1000, 1024, 1, 1000)).node == "pair"  # type: ignore[union-attr]


def test_popular_classes_of_a_weighted_workload_match_fgds_cut_of_the_pod_list() -> None:
    trace = [PodRequest(1000, 1024, 1, 500)] * 15 + [PodRequest(2000, 1024, 1, 1000)] * 4
    trace += [PodRequest(1000, 1024, 2, 1000)]
    whole = TypicalWorkload.from_pods(trace, popularity_percent=100)
    assert whole.popular(95.0) == TypicalWorkload.from_pods(trace)
    assert len(whole.popular(95.0).pods) == 2 and len(whole.pods) == 3


def test_kubegpu_breaks_a_shares_waste_tie_by_best_fit_then_rank() -> None:
    # Half whole-card pods, half 250-milli shares. A 100-milli share turns the 330 gap (80
    # unfillable) into 230 (all of it) and the 300 gap (50) into 200: +150 on both, one bucket.
    # FGD cannot tell them apart either (both truncate to score 48, rank 0 wins); ours takes
    # the tighter card, and between equal cards the first in rank (first fit).
    workload = TypicalWorkload.from_weights(
        [(PodRequest(1000, 0, 1, 1000), 0.5), (PodRequest(1000, 0, 1, 250), 0.5)]
    )
    nodes = [node("first", (330,), rank=0), node("tight", (300,), rank=1)]
    ours = engine(nodes, "kubegpu", workload)
    keys = ours.node_scorer.keys(share(100), ours.feasible_rows(share(100)))
    assert [key.tolist() for key in keys] == [[3, 3], [330, 300]]
    assert engine(nodes, "fgd", workload).score(share(100)) == {"first": 48, "tight": 48}
    assert ours.choose(share(100)).node == "tight"  # type: ignore[union-attr]
    twins = engine(
        [node("first", (300,), rank=0), node("second", (300,), rank=1)], "kubegpu", workload
    )
    assert twins.choose(share(100)).node == "first"  # type: ignore[union-attr]


def test_kubegpu_leaves_a_gap_a_common_share_fills_where_best_fit_leaves_a_sliver() -> None:
    # 500-milli shares are the common size. A 300-milli share on the 600 card (best fit)
    # leaves 300, which no common share fits; on the 800 card it leaves exactly 500.
    workload = TypicalWorkload.from_weights(
        [(PodRequest(1000, 0, 1, 500), 0.9), (PodRequest(1000, 0, 1, 300), 0.1)]
    )
    nodes = [node("n", (600, 800))]
    assert engine(nodes, "bestfit", workload).pick_gpus("n", share(300)) == (0,)
    assert engine(nodes, "kubegpu", workload).pick_gpus("n", share(300)) == (1,)


def test_kubegpu_sends_a_light_whole_card_pod_to_the_node_that_cannot_feed_its_cards() -> None:
    # The workload's GPU pods need 10 CPU milli per milli-GPU. "half-fed" has 12,000 milli-CPU
    # for two free cards: one typical pod fits, so FGD sees no fragment there and takes rank 0,
    # but the second card would be stranded. Ours gives that card to the pod asking little CPU.
    workload = TypicalWorkload.from_weights([(PodRequest(10_000, 0, 1, 1000), 1.0)])
    nodes = [
        node("fed", (1000, 1000), rank=0),
        node("half-fed", (1000, 1000), cpu_free=12_000, rank=1),
    ]
    light = PodRequest(2000, 1024, 1, 1000)
    assert engine(nodes, "fgd", workload).choose(light).node == "fed"  # type: ignore[union-attr]
    ours = engine(nodes, "kubegpu", workload)
    assert ours.choose(light).node == "half-fed"  # type: ignore[union-attr]


def test_kubegpu_keeps_cpu_only_pods_off_nodes_whose_cards_need_that_cpu() -> None:
    # "lean" has exactly the CPU its two free cards need at the workload's ratio (10 milli
    # per milli-GPU); a CPU-only pod there would strand 400 milli-GPU, on "rich" nothing.
    workload = TypicalWorkload.from_weights(
        [(PodRequest(10_000, 0, 1, 1000), 0.5), (PodRequest(4000, 0), 0.5)]
    )
    nodes = [
        node("lean", (1000, 1000), cpu_free=20_000, rank=0),
        node("rich", (1000, 1000), rank=1),
    ]
    cpu_pod = PodRequest(4000, 1024)
    ours = engine(nodes, "kubegpu", workload)
    assert ours.choose(cpu_pod).node == "rich"  # type: ignore[union-attr]
