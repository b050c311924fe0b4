"""07-Kubegpu's caches never change a decision: an engine warmed by every earlier pod (per-state
key tables, the best card's free milli per state, bucketed growth, fragment memos) chooses
exactly what a cold engine over the same cluster chooses, and the card it looks up is the one
pricing the node afresh picks."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import (
    FragmentationMemo,
    TypicalPod,
    TypicalWorkload,
    node_fragment_milli,
)
from kubegpu.placement.model import GpuState, NodeState, PodRequest

MODELS = ("A100", "T4", "V100")


def random_node(rng: random.Random, i: int) -> NodeState:
    cards = rng.choice([0, 1, 2, 4, 8, 8])
    mixed = cards >= 2 and rng.random() < 0.15  # a node mixing models names them per card
    gpus = tuple(
        GpuState(
            j,
            rng.choice([0, 100, 250, 500, 700, 1000, 1000, 1000]),
            rng.choice([None, None, 8192, 40960]),
            rng.choice(MODELS) if mixed else "",
        )
        for j in range(cards)
    )
    cpu_free = rng.choice([0, 2000, 8000, 32000, 96000])
    return NodeState(f"n{i:02d}", 96000, cpu_free, 262144, rng.choice(MODELS), gpus, rank=i)


def random_pod(rng: random.Random, i: int) -> PodRequest:
    cpu = rng.choice([0, 500, 4000, 16000])
    models = rng.choice([frozenset(), frozenset(), frozenset({"T4"}), frozenset({"A100", "V100"})])
    shape = rng.random()
    if shape < 0.2:
        return PodRequest(cpu, 1024, name=f"p{i}")
    if shape < 0.7:
        memory = rng.choice([None, None, None, 4096])
        milli = rng.choice([100, 250, 500, 900])
        return PodRequest(cpu, 1024, 1, milli, memory, models, name=f"p{i}")
    return PodRequest(cpu, 1024, rng.choice([1, 2, 4]), 1000, None, models, name=f"p{i}")


def cold_copy(warm: PlacementEngine, workload: TypicalWorkload) -> PlacementEngine:
    """A fresh engine over ``warm``'s cluster as it is now (same rank order, empty caches)."""
    return PlacementEngine([warm.node_state(name) for name in warm.names], "kubegpu", workload)


@pytest.mark.parametrize("seed", range(6))
def test_a_warm_engine_places_every_pod_where_a_cold_one_would(seed: int) -> None:
    rng = random.Random(seed)
    workload = TypicalWorkload.from_pods([random_pod(rng, i) for i in range(60)])
    warm = PlacementEngine([random_node(rng, i) for i in range(40)], "kubegpu", workload)
    placed = 0
    for i in range(60):
        pod = random_pod(rng, i)
        expected = cold_copy(warm, workload).choose(pod)
        assert warm.choose(pod) == expected, pod
        placed += warm.place(pod) is not None
    assert placed >= 20


@pytest.mark.parametrize("seed", range(6))
def test_the_looked_up_card_is_the_one_pricing_the_node_picks(seed: int) -> None:
    rng = random.Random(50 + seed)
    workload = TypicalWorkload.from_pods([random_pod(rng, i) for i in range(60)])
    engine = PlacementEngine([random_node(rng, i) for i in range(40)], "kubegpu", workload)
    scorer = engine.node_scorer
    checked = 0
    for i in range(80):
        pod = random_pod(rng, i)
        rows = engine.feasible_rows(pod)
        if pod.is_gpu_share and rows.size:
            scorer.best(pod, rows)  # ranks every feasible node: fills the per-state tables
            for row in rows.tolist():
                fresh = int(scorer.share_choice(pod, np.array([row]))[1][0])
                assert scorer.card(row, pod) == fresh
                checked += 1
        engine.place(pod)
    assert checked >= 50


def test_a_fragment_batch_with_cardless_and_padded_states_equals_the_loop() -> None:
    # Missing card slots are padded in a batch; a node without cards pads every slot.
    rnd = random.Random(7)
    classes = [
        TypicalPod(rnd.choice([0, 1000, 8000]) + i, milli, count, models, 1.0)
        for i, (milli, count, models) in enumerate(
            [(0, 0, frozenset()), (250, 1, frozenset()), (1000, 2, frozenset({"T4"}))] * 50
        )
    ]
    total = sum(t.weight for t in classes)
    workload = TypicalWorkload(
        tuple(
            TypicalPod(t.cpu_milli, t.gpu_milli, t.gpu_count, t.gpu_models, t.weight / total)
            for t in classes
        )
    )
    states = [(8000, (), "T4"), (0, (0,), "T4"), (9000, (250, 1000), "A100")]
    states += [(4000, (0, 100, 250, 1000, 1000, 1000, 1000, 1000), "T4"), (500, (999,), "T4")]
    memo = FragmentationMemo(workload)
    memo.prefetch(states)
    for cpu, free, model in states:
        assert memo._cache[(cpu, free, model)] == node_fragment_milli(cpu, free, model, workload)
