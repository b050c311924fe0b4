"""DRA's card choice (``placement.device_order``): first fit in slice order, first fit in
a steering driver's order, and that neither over-commits a card."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.placement.device_order import (
    CardChoice,
    DeviceOrderEngine,
    check_steerable,
    first_fit,
    parse_card_choice,
    share_classes,
)
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest
from kubegpu.placement.policies import get_policy


def node(
    name: str, free: list[int], memory: list[int] | None = None, cpu: int = 64_000
) -> NodeState:
    gpus = tuple(GpuState(i, f, None if memory is None else memory[i]) for i, f in enumerate(free))
    return NodeState(name, cpu, cpu, 1 << 20, "V100", gpus)


def share(milli: int, memory: int | None = None, cpu: int = 1000) -> PodRequest:
    return PodRequest(cpu, 1024, 1, milli, gpu_memory_mib=memory, name=f"share-{milli}")


# ----------------------------------------------------------------- first fit, by hand
def test_first_fit_takes_the_lowest_index_card_that_fits_where_best_fit_would_not() -> None:
    # Cards 0…3 free 300, 1000, 700, 550 milli. A 500 share: card 0 is too small, card 1 is
    # the first that fits. BestFit (the policy's own choice) takes card 3, the tightest.
    nodes = [node("a", [300, 1000, 700, 550])]
    first = DeviceOrderEngine(nodes, "bestfit", card_choice=CardChoice.FIRST_FIT)
    assert first.pick_gpus("a", share(500)) == (1,)
    assert PlacementEngine(nodes, "bestfit").pick_gpus("a", share(500)) == (3,)
    # A 200 share fits card 0 already.
    assert first.pick_gpus("a", share(200)) == (0,)


def test_first_fit_skips_a_card_whose_memory_does_not_fit() -> None:
    # Consumable capacity: both memory and compute must fit. Card 0 has the milli, not the
    # memory; card 1 has both.
    nodes = [node("a", [1000, 1000], memory=[4000, 16000])]
    engine = DeviceOrderEngine(nodes, "bestfit", card_choice=CardChoice.FIRST_FIT)
    assert engine.pick_gpus("a", share(500, memory=8000)) == (1,)
    assert engine.pick_gpus("a", share(500, memory=2000)) == (0,)


def test_whole_cards_are_the_lowest_index_free_ones() -> None:
    nodes = [node("a", [1000, 400, 1000, 1000])]
    engine = DeviceOrderEngine(nodes, "bestfit", card_choice=CardChoice.FIRST_FIT)
    assert engine.pick_gpus("a", PodRequest(1000, 1024, 2, 1000)) == (0, 2)


def test_first_fit_keeps_the_policys_node() -> None:
    # The node is still our policy's choice: BestFit puts the pod on the fuller node b.
    nodes = [node("a", [1000, 1000]), node("b", [1000, 400])]
    engine = DeviceOrderEngine(nodes, "bestfit", card_choice=CardChoice.FIRST_FIT)
    placed = engine.place(share(300))
    assert placed is not None and (placed.node, placed.gpu_indices) == ("b", (0,))


def test_first_fit_helper_walks_the_order_and_refuses_too_few() -> None:
    order = np.array([2, 0, 1])
    eligible = np.array([True, False, True])
    assert first_fit(order, eligible, 1) == (2,)
    assert first_fit(order, eligible, 2) == (2, 0)
    with pytest.raises(ValueError, match="only 2 of the 3"):
        first_fit(order, eligible, 3)


# ----------------------------------------------------------------- the node, seeing the card
def test_our_node_choice_prices_the_card_the_allocator_will_take() -> None:
    # Shares of 500 and 300. Node a (rank 0): card 0 whole, card 1 with 300 free; node b: the
    # same cards the other way round. Our policy ranks by a node's best card, which both have
    # (the 300 card for a 300 share), so it picks a by rank. The allocator on a walks to card
    # 0 first and breaks a whole card. Pricing the card first fit takes sends the share to b,
    # where card 0 is the tight one: the card our policy wanted, on another node.
    workload = TypicalWorkload.from_pods([share(500)] * 5 + [share(300)] * 5)
    nodes = [node("a", [1000, 300]), node("b", [300, 1000])]
    policy = PlacementEngine(nodes, "kubegpu", workload).choose(share(300))
    assert policy is not None and (policy.node, policy.gpu_indices) == ("a", (1,))
    blind = DeviceOrderEngine(
        nodes, "kubegpu", workload, card_choice=CardChoice.FIRST_FIT, allocator_aware=False
    ).choose(share(300))
    assert blind is not None and (blind.node, blind.gpu_indices) == ("a", (0,))
    aware = DeviceOrderEngine(nodes, "kubegpu", workload, card_choice=CardChoice.FIRST_FIT)
    placed = aware.choose(share(300))
    assert placed is not None and (placed.node, placed.gpu_indices) == ("b", (0,))
    # Whole cards and other policies: the policy's own node.
    whole = PodRequest(1000, 1024, 1, MILLI_PER_GPU)
    assert aware.choose(whole) == PlacementEngine(nodes, "kubegpu", workload).choose(whole)
    best_fit = DeviceOrderEngine(nodes, "bestfit", card_choice=CardChoice.FIRST_FIT)
    own = PlacementEngine(nodes, "bestfit").choose(share(300))
    chosen = best_fit.choose(share(300))
    assert own is not None and chosen is not None and chosen.node == own.node


def test_a_published_device_order_is_the_one_first_fit_walks_and_the_ranking_prices() -> None:
    # The cluster's slices list node a's cards as 1, 0 (a steering driver's order, read by
    # the extender): first fit on a now takes the tight card, so a wins again by rank.
    workload = TypicalWorkload.from_pods([share(500)] * 5 + [share(300)] * 5)
    nodes = [node("a", [1000, 300]), node("b", [300, 1000])]
    engine = DeviceOrderEngine(
        nodes,
        "kubegpu",
        workload,
        card_choice=CardChoice.FIRST_FIT,
        published_orders={"a": [1, 0]},
    )
    assert engine.device_order(0).tolist() == [1, 0]
    assert engine.device_order(1).tolist() == [0, 1]
    placed = engine.choose(share(300))
    assert placed is not None and (placed.node, placed.gpu_indices) == ("a", (1,))
    # Index order published again: back to b; unknown and repeated indices are ignored, and
    # cards the order leaves out follow in index order.
    engine.set_published_order("a", [0, 7, 0])
    assert engine.device_order(0).tolist() == [0, 1]
    again = engine.choose(share(300))
    assert again is not None and (again.node, again.gpu_indices) == ("b", (0,))


# ----------------------------------------------------------------- steered
def test_steered_puts_first_the_card_our_policy_prefers_for_the_workloads_shares() -> None:
    # The workload: 80 % shares of 500 milli, 20 % of 300. Card 0 has 600 free, card 1 1000.
    # A 500 share on card 0 leaves a 100-milli sliver no share fits (600 was two 300s); on
    # card 1 it leaves 500, which the next share fills: our policy takes card 1, first fit in
    # index order card 0. The steering driver publishes card 1 first, so first fit lands where
    # our policy would for the common share. A 300 share would have been better on card 0
    # (our policy's choice) but is the rarer one: one order cannot serve both, and the
    # expected cost picks the order for the 500s.
    workload = TypicalWorkload.from_pods([share(500)] * 8 + [share(300)] * 2)
    nodes = [node("a", [600, 1000])]
    policy = PlacementEngine(nodes, "kubegpu", workload)
    assert policy.pick_gpus("a", share(500)) == (1,)
    assert policy.pick_gpus("a", share(300)) == (0,)
    first = DeviceOrderEngine(nodes, "kubegpu", workload, card_choice=CardChoice.FIRST_FIT)
    assert first.pick_gpus("a", share(500)) == (0,)
    steered = DeviceOrderEngine(nodes, "kubegpu", workload, card_choice=CardChoice.STEERED)
    assert steered.device_order(0).tolist() == [1, 0]
    assert steered.pick_gpus("a", share(500)) == (1,)
    assert steered.pick_gpus("a", share(300)) == (1,)
    # The order is only an order: a share that fits card 0 alone still gets card 0.
    small = [node("a", [600, 300])]
    engine = DeviceOrderEngine(small, "kubegpu", workload, card_choice=CardChoice.STEERED)
    assert engine.pick_gpus("a", share(550)) == (0,)


def brute_force_order(free: list[int], costs: dict[tuple[int, int], float]) -> list[int]:
    """The oracle, in plain Python: the order of the distinct free values minimising the
    weighted cost of each share class's first fit (ties: the earliest permutation of the
    ascending values). ``costs[(class, value)]`` with classes 0…k−1 equally weighted."""
    values = sorted({f for f in free if f > 0})
    classes = sorted({k for k, _ in costs})
    best, best_cost = None, float("inf")
    for perm in itertools.permutations(values):
        total = 0.0
        for k in classes:
            for v in perm:
                if (k, v) in costs:
                    total += costs[(k, v)]
                    break
        if total < best_cost - 1e-9:
            best, best_cost = list(perm), total
    assert best is not None
    return best


def test_steered_order_is_the_one_minimising_the_expected_cost_of_the_next_share() -> None:
    workload = TypicalWorkload.from_pods([share(500)] * 3 + [share(250)] * 3 + [share(800)] * 3)
    free = [300, 1000, 550, 850, 0, 250]
    engine = DeviceOrderEngine(
        [node("a", free)], "kubegpu", workload, card_choice=CardChoice.STEERED
    )
    scorer = engine.node_scorer
    # The cost of a class on a value: our policy's card key (bucket, then free milli).
    costs: dict[tuple[int, int], float] = {}
    classes = [pod for pod, _ in share_classes(workload)]
    for k, pod in enumerate(classes):
        for v in sorted(set(free) - {0}):
            if v >= pod.gpu_milli:
                bucket = scorer.waste.share_buckets(
                    scorer.waste_entry[[0]],
                    np.array([[v]]),
                    engine.gpu_free_total[[0]].astype(float),
                    engine.cpu_free[[0]].astype(float),
                    pod.gpu_milli,
                    pod.cpu_milli,
                )[0, 0]
                costs[(k, v)] = bucket * (2 * MILLI_PER_GPU + 2) + v
    expected_values = brute_force_order(free, costs)
    order = engine.device_order(0).tolist()
    # Cards in the order of their free value, the full card (free 0) last.
    assert [free[c] for c in order] == [*expected_values, 0]
    # And a share takes the first card of that order it fits.
    for pod in classes:
        want = next(c for c in order if free[c] >= pod.gpu_milli)
        assert engine.pick_gpus("a", pod) == (want,)


def test_steered_with_an_ordering_policy_is_that_policy() -> None:
    # BestFit's comparator is an order of the cards: publishing it gives BestFit's choice.
    nodes = [node("a", [300, 1000, 700, 550])]
    engine = DeviceOrderEngine(nodes, "bestfit", card_choice=CardChoice.STEERED)
    assert engine.device_order(0).tolist() == [0, 3, 2, 1]
    for milli in (100, 400, 600, 800):
        pod = share(milli)
        assert engine.pick_gpus("a", pod) == PlacementEngine(nodes, "bestfit").pick_gpus("a", pod)


def test_steered_refuses_a_policy_whose_card_choice_is_no_order() -> None:
    with pytest.raises(ValueError, match="fgd chooses cards by fragmentation"):
        check_steerable(get_policy("fgd"))
    with pytest.raises(ValueError, match="random"):
        DeviceOrderEngine([node("a", [1000])], "random", card_choice=CardChoice.STEERED)
    check_steerable(get_policy("kubegpu"))


def test_card_choice_names() -> None:
    assert parse_card_choice(" First-Fit ") is CardChoice.FIRST_FIT
    with pytest.raises(ValueError, match="unknown card choice 'best'; known: policy, first-fit"):
        parse_card_choice("best")


# ----------------------------------------------------------------- never over-commit
pods_strategy = st.lists(
    st.one_of(
        st.builds(
            lambda milli, mem, cpu: PodRequest(cpu, 512, 1, milli, gpu_memory_mib=mem),
            st.integers(1, 999),
            st.one_of(st.none(), st.integers(1000, 12000)),
            st.integers(100, 8000),
        ),
        st.builds(
            lambda count, cpu: PodRequest(cpu, 512, count, MILLI_PER_GPU),
            st.integers(1, 3),
            st.integers(100, 8000),
        ),
        st.builds(lambda cpu: PodRequest(cpu, 512), st.integers(100, 8000)),
    ),
    min_size=1,
    max_size=40,
)
# Pods ask for some CPU: a workload of GPU pods asking for none has no CPU-per-GPU ratio, which
# our policy's waste model divides by (a limit of the policy, not of the card choice).
cluster_strategy = st.lists(st.integers(1, 4), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(
    cards=cluster_strategy,
    pods=pods_strategy,
    policy=st.sampled_from(["kubegpu", "bestfit", "spread"]),
    choice=st.sampled_from(list(CardChoice)),
)
def test_no_card_choice_over_commits(
    cards: list[int], pods: list[PodRequest], policy: str, choice: CardChoice
) -> None:
    card_memory = 16000
    nodes = [
        NodeState(
            f"n{i}",
            16000,
            16000,
            1 << 16,
            "V100",
            tuple(GpuState(j, free_memory_mib=card_memory) for j in range(n)),
        )
        for i, n in enumerate(cards)
    ]
    workload = TypicalWorkload.from_pods(pods)
    engine = DeviceOrderEngine(nodes, policy, workload, seed=1, card_choice=choice)
    # Our own ledger, from the placements alone.
    milli: dict[tuple[str, int], int] = {}
    memory: dict[tuple[str, int], int] = {}
    cpu: dict[str, int] = {}
    for pod in pods:
        placed = engine.place(pod)
        if placed is None:
            continue
        assert len(set(placed.gpu_indices)) == pod.gpu_count
        cpu[placed.node] = cpu.get(placed.node, 0) + pod.cpu_milli
        assert cpu[placed.node] <= 16000
        for g in placed.gpu_indices:
            key = (placed.node, g)
            milli[key] = milli.get(key, 0) + pod.gpu_milli
            memory[key] = memory.get(key, 0) + (pod.gpu_memory_mib or 0)
            assert milli[key] <= MILLI_PER_GPU, f"card {key} over-committed"
            assert memory[key] <= card_memory, f"card {key} memory over-committed"
    # The engine's accounting agrees with the ledger.
    for i, name in enumerate(engine.names):
        for j, g in enumerate(engine.card_index[i]):
            assert engine.card_free[i, j] == MILLI_PER_GPU - milli.get((name, g), 0)
