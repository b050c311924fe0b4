"""Nodes mixing card models: a pod restricted to models uses only cards of those models, every
policy, every path (feasibility, reasons, card choice, fragmentation); unrestricted pods use
any card; and a one-model node behaves the same whether its model is named on the node or on
each card."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import (
    TypicalPod,
    TypicalWorkload,
    node_fragment_milli,
    sigmoid_score,
)
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.policies import POLICIES

V100_MIB, T4_MIB = 16384, 15360
V100, T4 = frozenset({"V100"}), frozenset({"T4"})
WORKLOAD = TypicalWorkload(
    (
        TypicalPod(1000, 500, 1, T4, 0.4),
        TypicalPod(1000, 1000, 2, V100, 0.3),
        TypicalPod(2000, 250, 1, frozenset(), 0.2),
        TypicalPod(4000, 0, 0, frozenset(), 0.1),
    )
)


def mixed_node(
    name: str = "node-m", free: tuple[int, int, int, int] = (1000, 1000, 1000, 1000), rank: int = 0
) -> NodeState:
    """Like the fake preset 2xV100-2xT4: cards 0 and 1 are V100, 2 and 3 are T4."""
    models = ("V100", "V100", "T4", "T4")
    memory = (V100_MIB, V100_MIB, T4_MIB, T4_MIB)
    gpus = tuple(
        GpuState(j, milli, memory[j] * milli // 1000, models[j]) for j, milli in enumerate(free)
    )
    return NodeState(name, 64_000, 64_000, 262_144, "", gpus, rank=rank)


def engine(nodes: list[NodeState], policy: str = "bestfit") -> PlacementEngine:
    return PlacementEngine(nodes, policy, WORKLOAD, seed=7)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_restricted_share_lands_on_a_card_of_its_model(policy: str) -> None:
    # Card 0 (a V100) is the tightest fit, so a share without a model would go there.
    eng = engine([mixed_node(free=(600, 1000, 1000, 1000))], policy)
    t4_share = PodRequest(1000, 1024, 1, 400, 4096, T4, name="infer")
    placement = eng.place(t4_share)
    assert placement is not None and placement.gpu_indices[0] in (2, 3)
    v100_share = PodRequest(1000, 1024, 1, 400, 4096, V100, name="infer-v100")
    placement = eng.place(v100_share)
    assert placement is not None and placement.gpu_indices[0] in (0, 1)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_whole_cards_of_one_model_two_fit_three_do_not(policy: str) -> None:
    eng = engine([mixed_node()], policy)
    two = PodRequest(1000, 1024, 2, 1000, None, V100, name="train-2")
    three = PodRequest(1000, 1024, 3, 1000, None, V100, name="train-3")
    assert eng.explain("node-m", three).reason == (
        "node-m: needs 3 whole GPUs of model V100, 2 free (other free cards: 2 T4)"
    )
    assert eng.choose(three) is None
    placement = eng.place(two)
    assert placement is not None and placement.gpu_indices == (0, 1)
    # The V100s are gone; the T4s are still free but not for this pod.
    assert eng.explain("node-m", two).reason == (
        "node-m: needs 2 whole GPUs of model V100, 0 free (other free cards: 2 T4)"
    )
    assert eng.explain("node-m", replace(two, gpu_models=T4)).fits


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_unrestricted_pods_use_any_card(policy: str) -> None:
    eng = engine([mixed_node(free=(0, 0, 1000, 1000))], policy)
    share = PodRequest(1000, 1024, 1, 300, 2048, name="any-share")
    placement = eng.place(share)
    assert placement is not None and placement.gpu_indices[0] in (2, 3)
    eng = engine([mixed_node()], policy)
    placement = eng.place(PodRequest(1000, 1024, 4, 1000, name="all-four"))
    assert placement is not None and placement.gpu_indices == (0, 1, 2, 3)
    # A pod allowing both models is unrestricted here.
    both = PodRequest(1000, 1024, 4, 1000, None, V100 | T4)
    assert engine([mixed_node()], policy).choose(both) is not None


def test_share_reasons_on_a_mixed_node_name_the_model() -> None:
    eng = engine([mixed_node(free=(1000, 1000, 200, 100))])
    compute = PodRequest(1000, 1024, 1, 300, None, T4)
    assert eng.explain("node-m", compute).reason == (
        "node-m: largest free card share of model T4 is 200 milli, pod needs 300"
    )
    memory = PodRequest(1000, 1024, 1, 100, 4096, T4)
    assert eng.explain("node-m", memory).reason == (
        "node-m: largest free card of model T4 has 3072 MiB, pod needs 4096 MiB"
    )
    absent = PodRequest(1000, 1024, 1, 100, None, frozenset({"A100", "H100"}))
    assert eng.explain("node-m", absent).reason == (
        "node-m: GPU models T4+V100, pod allows A100|H100"
    )
    # The same pods without a model fit on the free V100s.
    assert eng.explain("node-m", replace(compute, gpu_models=frozenset())).fits
    assert eng.explain("node-m", replace(memory, gpu_models=frozenset())).fits


def test_mixed_nodes_keep_rank_order_among_one_model_nodes() -> None:
    t4_node = NodeState("node-a", 64_000, 64_000, 262_144, "T4", (GpuState(0, 1000, T4_MIB),))
    v100_node = NodeState(
        "node-z", 64_000, 64_000, 262_144, "V100", (GpuState(0, 1000, V100_MIB),), rank=2
    )
    eng = engine([v100_node, mixed_node(rank=1), t4_node])
    v100_share = PodRequest(1000, 1024, 1, 500, None, V100)
    assert [eng.names[i] for i in eng.feasible_rows(v100_share)] == ["node-m", "node-z"]
    t4_whole = PodRequest(1000, 1024, 2, 1000, None, T4)
    assert [eng.names[i] for i in eng.feasible_rows(t4_whole)] == ["node-m"]
    assert eng.score(t4_whole) == {"node-m": 0}
    assert not eng.explain("node-a", t4_whole).fits


def test_allocation_on_a_mixed_node_round_trips_through_node_state() -> None:
    eng = engine([mixed_node()], "fgd")
    pod = PodRequest(1000, 1024, 1, 500, 4096, T4)
    before = eng.node_state("node-m")
    assert before.card_models == ("V100", "V100", "T4", "T4")
    assert before.gpu_model == "" and before.gpus[2].model == "T4"
    placement = eng.place(pod)
    assert placement is not None
    after = eng.node_state("node-m")
    assert after == before.with_allocation(pod, placement.gpu_indices)
    eng.release("node-m", pod, placement.gpu_indices)
    assert eng.node_state("node-m") == before
    with pytest.raises(ValueError, match="card models"):
        eng.update_node(replace(before, gpus=tuple(replace(g, model="T4") for g in before.gpus)))


def test_fragment_of_a_mixed_node_counts_other_models_as_out_of_reach() -> None:
    workload = TypicalWorkload((TypicalPod(1000, 500, 1, T4, 1.0),))
    models = ("V100", "V100", "T4", "T4")
    # The T4 share fits on the free T4: the T4 with 300 is too small (Q2), the V100s' 2000
    # are out of its reach (no access).
    assert node_fragment_milli(8000, (1000, 1000, 300, 1000), models, workload) == 2300.0
    # No T4 fits it: all free GPU is fragment, as on a one-model node.
    assert node_fragment_milli(8000, (1000, 1000, 300, 200), models, workload) == 2500.0
    # A pod allowing every model sees the node as one-model.
    anyone = TypicalWorkload((TypicalPod(1000, 500, 1, frozenset(), 1.0),))
    free = (1000, 400, 300, 1000)
    assert node_fragment_milli(8000, free, models, anyone) == node_fragment_milli(
        8000, free, "T4", anyone
    )


def test_fgd_picks_the_card_leaving_the_least_fragment() -> None:
    # T4 card 2 has 600 free, card 3 is idle. A 500-milli T4 share on card 2 leaves 100
    # (fragment for every T4 share class); on card 3 it leaves 600 + 500, both usable. (Ours
    # sees no difference: 100 of the 600 stays unfilled by 500s and 250s either way, so it
    # takes the tighter card; tests/placement/test_waste.py covers its rule.)
    eng = engine([mixed_node(free=(1000, 1000, 600, 1000))], "fgd")
    pod = PodRequest(1000, 1024, 1, 500, None, T4)
    cpu = 64_000 - 1000
    models = ("V100", "V100", "T4", "T4")
    options = {
        col: node_fragment_milli(cpu, after, models, WORKLOAD)
        for col, after in ((2, (1000, 1000, 100, 1000)), (3, (1000, 1000, 600, 500)))
    }
    assert eng.pick_gpus("node-m", pod) == (min(options, key=lambda c: options[c]),)


# --------------------------------------------------------------------------- random clusters
MODELS = ("A100", "T4", "V100")


def random_node(rng: random.Random, name: str, rank: int) -> NodeState:
    cards = rng.choice([0, 1, 2, 4, 8])
    mixed = cards >= 2 and rng.random() < 0.5
    node_model = rng.choice(MODELS)
    gpus = tuple(
        GpuState(
            j,
            milli := rng.choice([0, 100, 250, 500, 700, 1000, 1000]),
            rng.choice([4096, 16384]) * milli // 1000,
            rng.choice(MODELS) if mixed else "",
        )
        for j in range(cards)
    )
    return NodeState(name, 96_000, rng.choice([0, 8000, 96_000]), 262_144, node_model, gpus, rank)


def random_pod(rng: random.Random) -> PodRequest:
    models = rng.choice([frozenset(), frozenset({"T4"}), frozenset({"V100", "A100"})])
    memory = rng.choice([None, 2048])
    if rng.random() < 0.5:
        return PodRequest(4000, 1024, 1, rng.choice([100, 250, 500, 900]), memory, models)
    return PodRequest(4000, 1024, rng.choice([1, 2, 4]), 1000, None, models)


def fits_by_hand(node: NodeState, pod: PodRequest) -> bool:
    if node.cpu_free_milli < pod.cpu_milli or node.memory_free_mib < pod.memory_mib:
        return False
    allowed = [g for g in node.gpus if pod.allows_model(g.model or node.gpu_model)]
    if pod.gpu_milli == 1000:
        return sum(1 for g in allowed if g.free_milli == 1000) >= pod.gpu_count
    need = pod.gpu_memory_mib or 0
    return any(g.free_milli >= pod.gpu_milli and (g.free_memory_mib or 0) >= need for g in allowed)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("seed", range(3))
def test_every_policy_places_only_where_a_hand_check_says_the_pod_fits(
    policy: str, seed: int
) -> None:
    rng = random.Random(seed)
    nodes = [random_node(rng, f"n{i:02d}", rng.randrange(40)) for i in range(40)]
    eng = PlacementEngine(nodes, policy, WORKLOAD, seed=seed)
    placed = 0
    for _ in range(60):
        pod = random_pod(rng)
        states = {name: eng.node_state(name) for name in eng.names}
        feasible = {eng.names[i] for i in eng.feasible_rows(pod)}
        assert feasible == {n for n, s in states.items() if fits_by_hand(s, pod)}
        for name in states:
            assert eng.explain(name, pod).fits == (name in feasible)
        placement = eng.place(pod)
        if placement is None:
            assert not feasible
            continue
        placed += 1
        state = states[placement.node]
        models = dict(zip(sorted(g.index for g in state.gpus), state.card_models, strict=True))
        assert all(pod.allows_model(models[g]) for g in placement.gpu_indices)
        assert len(set(placement.gpu_indices)) == pod.gpu_count
    assert placed >= 20


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_model_named_on_each_card_places_exactly_as_one_named_on_the_node(policy: str) -> None:
    rng = random.Random(11)
    on_node = [
        replace(n, gpus=tuple(replace(g, model="") for g in n.gpus))
        for n in (random_node(rng, f"n{i:02d}", i) for i in range(30))
    ]
    on_cards = [
        replace(n, gpu_model="", gpus=tuple(replace(g, model=n.gpu_model) for g in n.gpus))
        for n in on_node
    ]
    pods = [random_pod(rng) for _ in range(80)]
    first = PlacementEngine(on_node, policy, WORKLOAD, seed=3)
    second = PlacementEngine(on_cards, policy, WORKLOAD, seed=3)
    assert [first.place(p) for p in pods] == [second.place(p) for p in pods]


def fgd_by_hand(state: NodeState, pod: PodRequest) -> int:
    """FGD's node score from its definition: the best card's fragment decrease, per card model."""
    gpus = sorted(state.gpus, key=lambda g: g.index)
    free = tuple(g.free_milli for g in gpus)
    models = state.card_models
    cpu = state.cpu_free_milli
    before = node_fragment_milli(cpu, free, models, WORKLOAD)
    options = []
    if pod.is_gpu_share:
        for j, g in enumerate(gpus):
            memory_ok = pod.gpu_memory_mib is None or (g.free_memory_mib or 0) >= pod.gpu_memory_mib
            if g.free_milli >= pod.gpu_milli and memory_ok and pod.allows_model(models[j]):
                options.append((*free[:j], free[j] - pod.gpu_milli, *free[j + 1 :]))
    else:
        taken = [j for j in range(len(gpus)) if free[j] == 1000 and pod.allows_model(models[j])]
        chosen = set(taken[: pod.gpu_count])
        options.append(tuple(0 if j in chosen else f for j, f in enumerate(free)))
    return max(
        sigmoid_score(before, node_fragment_milli(cpu - pod.cpu_milli, after, models, WORKLOAD))
        for after in options
    )


@pytest.mark.parametrize("seed", range(4))
def test_fgd_node_scores_on_mixed_clusters_follow_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [random_node(rng, f"n{i:02d}", i) for i in range(40)]
    eng = PlacementEngine(nodes, "fgd", WORKLOAD)
    checked = 0
    for k in range(50):
        pod = random_pod(rng) if k % 5 else PodRequest(4000, 1024)
        rows = eng.feasible_rows(pod)
        expected = [fgd_by_hand(eng.node_state(eng.names[i]), pod) for i in rows.tolist()]
        assert eng.scores(pod, rows).tolist() == expected
        checked += int(any(eng.mixed[i] for i in rows.tolist()))
        eng.place(pod)
    assert checked >= 20


@pytest.mark.parametrize("seed", range(2))
def test_kubegpu_orders_cpu_pods_on_mixed_clusters_by_the_fragment_growth(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [random_node(rng, f"n{i:02d}", i) for i in range(40)]
    eng = PlacementEngine(nodes, "kubegpu", WORKLOAD)
    for k in range(30):
        pod = PodRequest(rng.choice([1000, 8000]), 1024) if k % 2 else random_pod(rng)
        rows = eng.feasible_rows(pod)
        if pod.gpu_count == 0 and rows.size:
            growth = []
            for i in rows.tolist():
                state = eng.node_state(eng.names[i])
                free = tuple(g.free_milli for g in sorted(state.gpus, key=lambda g: g.index))
                cpu, models = state.cpu_free_milli, state.card_models
                growth.append(
                    node_fragment_milli(cpu - pod.cpu_milli, free, models, WORKLOAD)
                    - node_fragment_milli(cpu, free, models, WORKLOAD)
                )
            # The engine's buckets (GROWTH_BUCKET_MILLI), from the growth by definition.
            buckets = np.floor(np.round(np.array(growth), 6) / 300.0)
            assert eng.node_scorer.keys(pod, rows)[1].tolist() == buckets.tolist()
        eng.place(pod)
