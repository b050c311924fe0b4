"""``FragmentationMemo(cpu_levels=True)`` (07-Kubegpu's memos) keys a node's free CPU by its
level, the largest class CPU request it covers: F(n) reads the free CPU only through each
class's "does its CPU fit", so every free CPU of one level must give F(n) bit for bit, one
cache entry serves them all, and placements are those of exact keys."""

from __future__ import annotations

import random

import pytest

from kubegpu.placement import engine as engine_module
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import (
    FragmentationMemo,
    TypicalPod,
    TypicalWorkload,
    node_fragment_milli,
)
from tests.placement.test_kubegpu_caches import random_node, random_pod

MODELS = ("T4", "G2", "P100")


def random_workload(rnd: random.Random, classes: int) -> TypicalWorkload:
    pods = []
    for _ in range(classes):
        count = rnd.choice([0, 1, 1, 2, 4])
        milli = 0 if not count else (rnd.choice([50, 230, 500]) if count == 1 else 1000)
        models = (
            frozenset(rnd.sample(MODELS, rnd.choice([1, 2])))
            if count and rnd.random() < 0.3
            else frozenset()
        )
        pods.append(
            TypicalPod(
                rnd.choice([0, 1000, 4000, 4000, 12000, 33000]), milli, count, models, rnd.random()
            )
        )
    total = sum(p.weight for p in pods)
    return TypicalWorkload(
        tuple(
            TypicalPod(p.cpu_milli, p.gpu_milli, p.gpu_count, p.gpu_models, p.weight / total)
            for p in pods
        )
    )


@pytest.mark.parametrize("classes", [5, 40, 130])  # 130: the vectorised single-state path
@pytest.mark.parametrize("seed", range(3))
def test_every_free_cpu_of_a_level_gives_the_exact_fragment(seed: int, classes: int) -> None:
    rnd = random.Random(seed)
    workload = random_workload(rnd, classes)
    levels = sorted({t.cpu_milli for t in workload.pods})
    memo = FragmentationMemo(workload, cpu_levels=True)
    batched = FragmentationMemo(workload, cpu_levels=True)
    states = []
    for _ in range(300):
        cards = rnd.choice([1, 2, 4, 8])
        free = tuple(sorted(rnd.choice([0, 1, 60, 230, 500, 1000]) for _ in range(cards)))
        # Free CPU on, just below and just above a class's request, and in between.
        cpu = (
            rnd.choice(levels) + rnd.choice([-1, 0, 0, 1, 700])
            if rnd.random() < 0.7
            else rnd.randrange(-5, 99000)
        )
        model: str | tuple[str, ...] = rnd.choice(MODELS)
        if rnd.random() < 0.2:  # a node mixing models: one per card, in card order
            model = tuple(rnd.choice(MODELS) for _ in range(cards))
        exact = node_fragment_milli(cpu, free, model, workload)
        assert memo.fragment(cpu, free, model) == exact, (cpu, free, model)
        if isinstance(model, str):
            states.append((cpu, free, model, exact))
    batched.prefetch([(cpu, free, model) for cpu, free, model, _ in states])
    for cpu, free, model, exact in states:
        assert batched.fragment(cpu, free, model) == exact


def test_a_level_keeps_every_class_cpu_answer_and_shares_one_entry() -> None:
    rnd = random.Random(5)
    workload = random_workload(rnd, 20)
    requests = sorted({t.cpu_milli for t in workload.pods})
    memo = FragmentationMemo(workload, cpu_levels=True)
    for cpu in range(-3, 40000, 7):
        level = memo.cpu_key(cpu)
        assert all((level >= r) == (cpu >= r) for r in requests), cpu
    # Free CPU 12000 … 32999 is one level (requests 0, 1000, 4000, 12000, 33000): one entry.
    assert (
        12000 in requests and 33000 in requests and not [r for r in requests if 12000 < r < 33000]
    )
    for cpu in range(12000, 33000, 1000):
        memo.fragment(cpu, (0, 500, 1000), "T4")
    assert len(memo._cache) == 1
    assert FragmentationMemo(workload).cpu_key(12345) == 12345  # exact keys by default


@pytest.mark.parametrize("seed", range(4))
def test_ours_with_cpu_levels_places_every_pod_as_with_exact_keys(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(900 + seed)
    pods = [random_pod(rng, i) for i in range(150)]
    workload = TypicalWorkload.from_pods(pods[:60])
    nodes = [random_node(rng, i) for i in range(40)]
    levelled = PlacementEngine(nodes, "kubegpu", workload)
    assert levelled._fgd is not None and levelled._fgd.memo._cpu_levels is not None

    class ExactMemo(FragmentationMemo):
        def __init__(self, workload: TypicalWorkload, *, cpu_levels: bool = False) -> None:
            super().__init__(workload)

    monkeypatch.setattr(engine_module, "FragmentationMemo", ExactMemo)
    exact = PlacementEngine(nodes, "kubegpu", workload)
    assert exact._fgd is not None and exact._fgd.memo._cpu_levels is None
    placed = 0
    for pod in pods:
        got = levelled.place(pod)
        assert got == exact.place(pod), pod
        placed += got is not None
    assert placed >= 40
