"""The vectorised score paths give exactly what the scalar code they replaced gave, on random
clusters, pods and sort keys (the scalar versions live here as the reference)."""

from __future__ import annotations

import random

import numpy as np
import numpy.typing as npt
import pytest

from kubegpu.placement.engine import PlacementEngine, order_scores
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest

IntArray = npt.NDArray[np.int64]


def scalar_order_scores(keys: list[npt.NDArray[np.float64]]) -> IntArray:
    """The engine's former per-row loop, verbatim."""
    n = keys[0].size
    order = np.lexsort(tuple(reversed(keys)))
    out = np.zeros(n, dtype=np.int64)
    position = 0
    previous: tuple[float, ...] | None = None
    for k, idx in enumerate(order.tolist()):
        current = tuple(float(key[idx]) for key in keys)
        if current != previous:
            position, previous = k, current
        out[idx] = 100 - position * 100 // (n - 1)
    return out


def random_cluster(rng: random.Random, size: int) -> list[NodeState]:
    nodes = []
    for i in range(size):
        cards = rng.choice([0, 1, 2, 4, 8, 8])
        gpus = tuple(
            GpuState(j, rng.choice([0, 100, 250, 500, 700, 1000, 1000, 1000])) for j in range(cards)
        )
        nodes.append(
            NodeState(
                f"n{i:03d}",
                96000,
                rng.choice([0, 2000, 8000, 32000, 96000]),
                262144,
                rng.choice(["A100", "T4", "V100"]),
                gpus,
                rank=rng.randrange(size),
            )
        )
    return nodes


def random_pod(rng: random.Random) -> PodRequest:
    cpu = rng.choice([0, 500, 4000, 16000])
    models = rng.choice([frozenset(), frozenset(), frozenset({"T4"})])
    shape = rng.random()
    if shape < 0.25:
        return PodRequest(cpu, 1024)
    if shape < 0.65:
        return PodRequest(cpu, 1024, 1, rng.choice([100, 250, 500, 900]), None, models)
    return PodRequest(cpu, 1024, rng.choice([1, 2, 4, 8]), 1000, None, models)


def random_workload(rng: random.Random) -> TypicalWorkload:
    return TypicalWorkload.from_pods([random_pod(rng) for _ in range(40)])


@pytest.mark.parametrize("seed", range(12))
def test_kubegpu_scores_equal_the_former_per_row_loop_on_random_clusters(seed: int) -> None:
    rng = random.Random(seed)
    engine = PlacementEngine(random_cluster(rng, 150), "kubegpu", random_workload(rng))
    checked = 0
    for _ in range(30):
        pod = random_pod(rng)
        rows = engine.feasible_rows(pod)
        if rows.size >= 2:
            keys = engine.node_scorer.keys(pod, rows)
            assert engine.scores(pod, rows).tolist() == scalar_order_scores(keys).tolist()
            checked += 1
        # Bind it somewhere so later pods see a changed cluster (and new row states).
        engine.place(pod)
    assert checked >= 10


@pytest.mark.parametrize("seed", range(20))
def test_order_scores_equal_the_former_loop_on_keys_with_ties_and_nan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    keys = []
    for _ in range(int(rng.integers(1, 4))):
        key = rng.integers(-3, 4, size=n).astype(np.float64) / 3.0  # many ties
        key[rng.random(n) < 0.05] = np.nan
        key[rng.random(n) < 0.05] = np.inf
        key[rng.random(n) < 0.05] = -0.0
        keys.append(key)
    assert order_scores(keys).tolist() == scalar_order_scores(keys).tolist()


def test_order_scores_give_equal_keys_equal_scores_and_the_best_100() -> None:
    keys = [np.array([2.0, 1.0, 1.0, 3.0]), np.array([0.0, 5.0, 5.0, 0.0])]
    assert order_scores(keys).tolist() == [34, 100, 100, 0]  # 100 - 2·100 div 3


@pytest.mark.parametrize("seed", range(12))
def test_kubegpu_choice_is_the_first_node_of_the_full_sort_on_random_clusters(seed: int) -> None:
    # The simulator computes later keys only on the nodes tied on earlier ones; it must pick
    # the node a full lexicographic sort of all keys puts first (the extender's score 100).
    rng = random.Random(100 + seed)
    engine = PlacementEngine(random_cluster(rng, 150), "kubegpu", random_workload(rng))
    checked = 0
    for _ in range(40):
        pod = random_pod(rng)
        rows = engine.feasible_rows(pod)
        if rows.size >= 2:
            keys = engine.node_scorer.keys(pod, rows)
            first = int(np.lexsort(tuple(reversed(keys)))[0])
            assert engine.node_scorer.best(pod, rows) == first
            checked += 1
        engine.place(pod)
    assert checked >= 10
