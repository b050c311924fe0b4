"""Our policy's waste potential against values worked out by hand, and the engine's card
choice held to it on random clusters."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.waste import (
    WastePotential,
    WasteWeights,
    common_share_sizes,
    cpu_per_gpu_milli,
    gap_waste_table,
)


@pytest.mark.parametrize(
    ("gap", "waste"),
    [
        pytest.param(0, 0, id="no gap"),
        pytest.param(190, 190, id="810 leftover: nothing common fits"),
        pytest.param(320, 0, id="exactly one 320"),
        pytest.param(530, 60, id="one 470 leaves 60"),
        pytest.param(650, 10, id="two 320 leave 10"),
        pytest.param(790, 0, id="470 + 320"),
        pytest.param(999, 39, id="470 + 470 leaves 59, 320·3 leaves 39"),
        pytest.param(1000, 0, id="a free card is no waste"),
    ],
)
def test_gap_waste_is_what_the_common_sizes_cannot_pack(gap: int, waste: int) -> None:
    assert gap_waste_table([470, 320])[gap] == waste


def test_gap_waste_ignores_sizes_outside_a_share() -> None:
    assert gap_waste_table([0, 1000, 1200]).tolist() == [*range(1000), 0]


def workload(*classes: tuple[int, int, int, float]) -> TypicalWorkload:
    """(cpu milli, gpu milli, gpu count, weight) classes."""
    return TypicalWorkload.from_weights(
        [(PodRequest(cpu, 0, count, milli), weight) for cpu, milli, count, weight in classes]
    )


def test_common_sizes_cover_85_percent_of_the_sharing_pods_most_likely_first() -> None:
    # Shares: 810 (0.30), 470 (0.25; two CPU classes, merged), 320 (0.08), 160 (0.07).
    # Whole cards and CPU-only pods do not count. 810+470 = 0.55 of 0.70 = 79 % < 85 %.
    w = workload(
        (3000, 810, 1, 0.30),
        (8000, 470, 1, 0.15),
        (11_000, 470, 1, 0.10),
        (4000, 320, 1, 0.08),
        (4000, 160, 1, 0.07),
        (11_000, 1000, 1, 0.20),
        (8000, 0, 0, 0.10),
    )
    assert common_share_sizes(w) == [810, 470, 320]
    assert common_share_sizes(w, percent=50.0) == [810, 470]
    assert common_share_sizes(workload((11_000, 1000, 1, 1.0))) == []


def test_cpu_per_gpu_milli_weighs_classes_by_likelihood_and_ignores_cpu_only_pods() -> None:
    # (0.5·11000 + 0.25·3000) / (0.5·1000 + 0.25·810) = 6250 / 702.5
    w = workload((11_000, 1000, 1, 0.5), (3000, 810, 1, 0.25), (32_000, 0, 0, 0.25))
    assert cpu_per_gpu_milli(w) == pytest.approx(6250 / 702.5)
    assert cpu_per_gpu_milli(workload((8000, 0, 0, 1.0))) is None
    # GPU pods that ask no CPU strand nothing (a ratio of 0 divided by zero).
    assert cpu_per_gpu_milli(workload((0, 500, 1, 0.5), (0, 1000, 1, 0.5))) is None


def test_kubegpu_places_gpu_pods_that_ask_no_cpu() -> None:
    pods = [PodRequest(0, 0, 1, 500), PodRequest(0, 0, 1, 1000)]
    target = TypicalWorkload.from_pods(pods, popularity_percent=100.0)
    engine = PlacementEngine(random_cluster(random.Random(1), 4), "kubegpu", target)
    for pod in pods * 2:
        placement = engine.place(pod)
        assert placement is not None, pod


def test_stranded_gpu_is_what_free_cpu_cannot_carry_at_the_workload_ratio() -> None:
    potential = WastePotential(gap_waste_table([]), 10.0)  # 10 CPU milli per milli-GPU
    gpu = np.array([2000.0, 2000.0, 0.0, 1000.0])
    cpu = np.array([30_000.0, 12_000.0, 0.0, -5.0])
    assert potential.stranded(gpu, cpu).tolist() == [0.0, 800.0, 0.0, 1000.0]
    # A pod taking one card and 2,000 milli-CPU from the second node frees its stranded card.
    growth = potential.stranded_growth(gpu[1:2], cpu[1:2], 1000, 2000)
    assert growth.tolist() == [-800.0]
    # Without GPU pods in the workload nothing is ever stranded.
    assert WastePotential(gap_waste_table([]), None).stranded(gpu, cpu).tolist() == [0.0] * 4


def test_card_gap_growth_is_infinite_on_cards_a_share_does_not_fit() -> None:
    potential = WastePotential(gap_waste_table([470]), None)
    growth = potential.card_gap_growth(np.array([[1000, 530, 400, -1]]), 470)
    # 1000 → 530 (60 unfillable, a free card counted 0); 530 → 60 (60 either way).
    assert growth.tolist() == [[60.0, 0.0, np.inf, np.inf]]


# ---------------------------------------------------------------- the engine follows the rule
def random_cluster(rng: random.Random, n: int) -> list[NodeState]:
    nodes = []
    for i in range(n):
        cards = rng.choice([1, 2, 4, 8])
        gpus = tuple(GpuState(j, rng.choice([0, 190, 320, 530, 1000, 1000])) for j in range(cards))
        cpu = rng.choice([2000, 16_000, 64_000])
        nodes.append(NodeState(f"n{i:03d}", 96_000, cpu, 262_144, "T4", gpus, rng.randrange(n)))
    return nodes


TRACE = [PodRequest(11_000, 0, 1, 1000)] * 5 + [PodRequest(3000, 0, 1, 810)] * 3
TRACE += [PodRequest(8000, 0, 1, 470)] * 2 + [PodRequest(4000, 0, 1, 160), PodRequest(12_000, 0)]


@pytest.mark.parametrize("seed", range(6))
def test_kubegpu_places_each_share_on_the_card_of_least_cost_bucket(seed: int) -> None:
    rng = random.Random(seed)
    target = TypicalWorkload.from_pods(TRACE, popularity_percent=100.0)
    engine = PlacementEngine(random_cluster(rng, 60), "kubegpu", target)
    potential = WastePotential.from_workload(target)
    checked = 0
    for _ in range(80):
        pod = PodRequest(rng.choice([1000, 4000, 12_000]), 0, 1, rng.choice([160, 470, 810]))
        rows = engine.feasible_rows(pod)
        placement = engine.choose(pod)
        if placement is None:
            break
        i = engine.row_of(placement.node)
        free = engine.card_free[i, : engine.gpu_count[i]]
        stranded = potential.stranded_growth(
            np.array([float(free.sum())]),
            np.array([float(engine.cpu_free[i])]),
            pod.gpu_milli,
            pod.cpu_milli,
        )[0]
        weights = WasteWeights()
        cost = potential.card_gap_growth(free, pod.gpu_milli) + weights.cpu_weight * stranded
        buckets = np.floor(np.round(cost, 6) / weights.bucket_milli)
        col = placement.gpu_indices[0]
        # The chosen card is in the node's least bucket, and no card there is tighter.
        assert buckets[col] == buckets.min()
        assert free[col] == free[buckets == buckets.min()].min()
        # And no feasible node has a card in a lower bucket.
        assert buckets.min() == engine.node_scorer.keys(pod, rows)[0].min()
        engine.allocate(placement.node, pod, placement.gpu_indices)
        checked += 1
    assert checked >= 20
