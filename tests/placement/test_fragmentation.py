"""FGD's fragmentation measure and target workload against values computed by hand."""

from __future__ import annotations

import math

import pytest

from kubegpu.placement.fragmentation import (
    TypicalPod,
    TypicalWorkload,
    node_fragment_milli,
    sigmoid_score,
)
from kubegpu.placement.model import PodRequest

# Half the pods want 500 milli of a card, a quarter are CPU-only, a quarter want 2 whole cards.
MIXED = TypicalWorkload(
    (
        TypicalPod(1000, 500, 1, frozenset(), 0.5),
        TypicalPod(2000, 0, 0, frozenset(), 0.25),
        TypicalPod(4000, 1000, 2, frozenset(), 0.25),
    )
)


@pytest.mark.parametrize(
    ("cpu_free", "cards", "expected"),
    [
        # share pod fits, only the 300-milli card is too small: 0.5·300; CPU-only pods see all
        # 1300 free as fragment: 0.25·1300; two whole cards do not fit: 0.25·1300.
        pytest.param(8000, (1000, 300), 0.5 * 300 + 0.25 * 1300 + 0.25 * 1300, id="mixed-node"),
        # everything fits: only the CPU-only share counts, 0.25·2000.
        pytest.param(8000, (1000, 1000), 0.25 * 2000, id="idle-node"),
        # 500 milli CPU left: no GPU pod fits by CPU, so all free GPU is fragment for all.
        pytest.param(500, (1000, 1000), 2000.0, id="cpu-exhausted"),
        # no free GPU: nothing to fragment.
        pytest.param(8000, (0, 0), 0.0, id="gpus-full"),
        # 3000 CPU: the share pod fits (cards 400 too small → 0.5·400), the 2-card pod lacks
        # CPU although its cards fit (Q4 → 0.25·2400).
        pytest.param(3000, (1000, 1000, 400), 0.5 * 400 + 0.25 * 2400 + 0.25 * 2400, id="q4"),
    ],
)
def test_node_fragment_matches_hand_computed_values(
    cpu_free: int, cards: tuple[int, ...], expected: float
) -> None:
    assert node_fragment_milli(cpu_free, cards, "T4", MIXED) == pytest.approx(expected)


def test_pods_not_allowed_on_the_model_see_all_free_gpu_as_fragment() -> None:
    only_v100 = TypicalWorkload((TypicalPod(1000, 500, 1, frozenset({"V100M32"}), 1.0),))
    assert node_fragment_milli(8000, (1000, 200), "T4", only_v100) == 1200.0
    assert node_fragment_milli(8000, (1000, 200), "V100M32", only_v100) == 200.0


def test_typical_workload_keeps_the_popular_classes_covering_95_percent_and_renormalises() -> None:
    pods = (
        [PodRequest(1000, 1, 1, 500)] * 60  # 60 %
        + [PodRequest(2000, 9, 0, 0)] * 36  # 36 % → cumulative 96 % ≥ 95 %: stop here
        + [PodRequest(8000, 1, 8, 1000)] * 4  # dropped
    )
    workload = TypicalWorkload.from_pods(pods)
    assert [(p.cpu_milli, p.gpu_milli, p.gpu_count) for p in workload.pods] == [
        (1000, 500, 1),
        (2000, 0, 0),
    ]
    assert [p.weight for p in workload.pods] == pytest.approx([60 / 96, 36 / 96])


def test_typical_workload_ignores_memory_and_breaks_popularity_ties_by_class() -> None:
    pods = [PodRequest(1000, 1, 1, 500), PodRequest(1000, 99, 1, 500), PodRequest(3000, 1, 1, 200)]
    pods += [PodRequest(3000, 5, 1, 200)]
    workload = TypicalWorkload.from_pods(pods, popularity_percent=100)
    assert [(p.cpu_milli, p.weight) for p in workload.pods] == [(3000, 0.5), (1000, 0.5)]


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [(0.0, 0.0, 50), (1000.0, 0.0, 73), (0.0, 1000.0, 26), (0.0, 40.0, 49)],
)
def test_fgd_score_is_truncated_sigmoid_of_the_fragment_decrease(
    before: float, after: float, expected: int
) -> None:
    assert sigmoid_score(before, after) == expected
    assert expected == int(100 / (1 + math.exp(-(before - after) / 1000)))


def test_vectorised_fragment_equals_the_loop_bit_for_bit_on_many_constrained_classes() -> None:
    # Enough classes for the numpy path (VECTOR_CLASSES), with model sets, CPU-only and
    # multi-card classes; equality, not approx: FGD's truncated score can flip on a last bit.
    import random

    from kubegpu.placement.fragmentation import VECTOR_CLASSES, FragmentationMemo

    rnd = random.Random(14)
    specs = ["", "", "T4", "G2|T4", "P100|V100M16|V100M16", "G3"]
    classes = []
    for i in range(VECTOR_CLASSES + 40):
        count = rnd.choice([0, 1, 1, 1, 2, 8])
        milli = 0 if count == 0 else (rnd.choice([50, 230, 500, 1000]) if count == 1 else 1000)
        models = frozenset(m for m in rnd.choice(specs).split("|") if m) if count else frozenset()
        classes.append(TypicalPod(rnd.choice([1000, 4000, 12000]) + i, milli, count, models, 0.0))
    weights = [rnd.random() for _ in classes]
    workload = TypicalWorkload(
        tuple(
            TypicalPod(t.cpu_milli, t.gpu_milli, t.gpu_count, t.gpu_models, w / sum(weights))
            for t, w in zip(classes, weights, strict=True)
        )
    )
    memo = FragmentationMemo(workload)
    states = []
    for _ in range(500):
        cards = rnd.choice([1, 2, 4, 8])
        free = tuple(sorted(rnd.choice([0, 1, 60, 230, 500, 999, 1000]) for _ in range(cards)))
        cpu = rnd.choice([0, 1500, 6000, 40000])
        model = rnd.choice(["T4", "G2", "P100", "V100M16", "A10"])
        states.append((cpu, free, model))
        assert memo.fragment(cpu, free, model) == node_fragment_milli(cpu, free, model, workload)
    # The batched pass (states of different card counts in one array) gives the same bits.
    batched = FragmentationMemo(workload)
    batched.prefetch(states)
    for cpu, free, model in states:
        assert batched._cache[(cpu, free, model)] == node_fragment_milli(cpu, free, model, workload)
