"""``FragmentationMemo(cpu_levels=True)`` (07-Kubegpu's memos) keys a node's free CPU by its
level, the largest class CPU request it covers: F(n) reads the free CPU only through each
class's "does its CPU fit", so every free CPU of one level must give F(n) bit for bit, one
cache entry serves them all, and placements are those of exact keys."""

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
from kubegpu.placement.policies import fgd as fgd_module
from kubegpu.placement.policies.fgd import FgdScorer, LevelledKey
from tests.placement.test_kubegpu_caches import random_node, random_pod

MODELS = ("T4", "G2", "P100")


# Class CPU requests 0 and 4000 (levels -1, 0 and 4000): a 500-milli share and a CPU-only pod.
SHARE_AND_CPU_ONLY = TypicalWorkload(
    (
        TypicalPod(4000, 500, 1, frozenset(), 0.5),
        TypicalPod(0, 0, 0, frozenset(), 0.5),
    )
)


def levels_computed(fgd: FgdScorer, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (level before, level after) of every state whose fragments ``fgd`` computes from
    now on, in order (lookups add none)."""
    computed: list[tuple[int, int]] = []
    fragments = fgd.fragments_at_levels

    def counted(pod: PodRequest, keys: list[LevelledKey]) -> list[tuple[float, list[float]]]:
        computed.extend((before, after) for before, after, _, _ in keys)
        return fragments(pod, keys)

    monkeypatch.setattr(fgd, "fragments_at_levels", counted)
    return computed


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
    assert levelled.node_scorer.fgd.memo._cpu_levels is not None

    class ExactMemo(FragmentationMemo):
        def __init__(self, workload: TypicalWorkload, *, cpu_levels: bool = False) -> None:
            super().__init__(workload)

    monkeypatch.setattr(fgd_module, "FragmentationMemo", ExactMemo)
    exact = PlacementEngine(nodes, "kubegpu", workload)
    assert exact.node_scorer.fgd.memo._cpu_levels is None
    placed = 0
    for pod in pods:
        got = levelled.place(pod)
        assert got == exact.place(pod), pod
        placed += got is not None
    assert placed >= 40


@pytest.mark.parametrize("seed", range(4))
def test_scores_and_growth_looked_up_by_level_are_the_exact_ones(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FGD's score (our tie-break) and a CPU-only pod's growth bucket are kept per (level
    # before, level after, free milli, model): every row's value equals what an engine with
    # exact keys computes, and the levels did serve states first met under another free CPU.
    rng = random.Random(700 + seed)
    # A dozen pod classes, each coming many times (the tables are per class), among them
    # CPU-only pods that move a node's free CPU within a level.
    pool = [random_pod(rng, i) for i in range(10)] + [PodRequest(500, 1024, name="cpu")]
    pods = [rng.choice(pool) for _ in range(250)]
    workload = TypicalWorkload.from_pods(pods[:60])
    nodes = [random_node(rng, i) for i in range(40)]
    levelled = PlacementEngine(nodes, "kubegpu", workload)

    class ExactMemo(FragmentationMemo):
        def __init__(self, workload: TypicalWorkload, *, cpu_levels: bool = False) -> None:
            super().__init__(workload)

    monkeypatch.setattr(fgd_module, "FragmentationMemo", ExactMemo)
    exact = PlacementEngine(nodes, "kubegpu", workload)
    ours, theirs = levelled.node_scorer, exact.node_scorer
    compared = 0
    for pod in pods:
        rows = levelled.feasible_rows(pod)
        assert rows.tolist() == exact.feasible_rows(pod).tolist()
        if rows.size and pod.gpu_count:
            assert ours.fgd.scores(pod, rows).tolist() == theirs.fgd.scores(pod, rows).tolist()
            compared += 1
        elif rows.size:
            got = ours._growth_bucket(pod, rows).tolist()
            assert got == theirs._growth_bucket(pod, rows).tolist()
            compared += 1
        assert levelled.place(pod) == exact.place(pod)
    assert compared >= 100


def test_a_node_whose_cpu_moved_within_its_level_is_scored_by_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Class CPU requests 0 and 4000: free CPU 96000 and 95000 are one level, and so are
    # both less the pod's 4000. The second node's score is the first's, not computed again.
    workload = SHARE_AND_CPU_ONLY
    nodes = [
        NodeState(f"n{i}", 96000, cpu, 262144, "T4", (GpuState(0, 1000), GpuState(1, 300)), rank=i)
        for i, cpu in enumerate([96000, 95000, 3000, 9000, 5000])
    ]
    engine = PlacementEngine(nodes, "kubegpu", workload)
    fgd = engine.node_scorer.fgd
    # (level before, level after) of each state whose fragments are computed.
    computed = levels_computed(fgd, monkeypatch)
    pod = PodRequest(4000, 1024, 1, 500, name="share")
    first = fgd.scores(pod, np.array([0]))
    assert computed == [(4000, 4000)]
    assert fgd.scores(pod, np.array([1])).tolist() == first.tolist()
    assert computed == [(4000, 4000)]  # looked up
    exact = FgdScorer(engine, FragmentationMemo(workload))
    assert exact.scores(pod, np.array([0, 1])).tolist() == [first[0], first[0]]
    # Another level (3000 < 4000: the share's CPU no longer fits) is computed.
    fgd.scores(pod, np.array([2]))
    assert computed == [(4000, 4000), (0, -1)]
    # 9000 and 5000 are 96000's level, but less the pod's 4000 only 9000 is (5000 against
    # 1000): 9000 is a lookup, 5000 is computed, and scores differently.
    scores = fgd.scores(pod, np.array([3, 4]))
    assert computed == [(4000, 4000), (0, -1), (4000, 0)]
    assert scores.tolist() == exact.scores(pod, np.array([3, 4])).tolist()
    assert scores[0] == first[0] != scores[1]
    # So does a CPU-only pod's growth bucket (ours' third key) on those two.
    scorer = engine.node_scorer
    cpu_pod = PodRequest(4000, 1024, name="cpu")
    growth = scorer._growth_bucket(cpu_pod, np.array([0, 1, 3, 4])).tolist()
    assert growth[0] == growth[1] != growth[3]
    cold = PlacementEngine(nodes, "kubegpu", workload).node_scorer
    assert growth == [cold._growth_bucket(cpu_pod, np.array([i])).tolist()[0] for i in (0, 1, 3, 4)]


@pytest.mark.parametrize("classes", [2, 40, 91, 200])
def test_one_missing_state_is_computed_by_the_single_state_pass_bit_for_bit(
    classes: int,
) -> None:
    # A prefetch that finds one state missing computes it with _ClassArrays.fragment (the
    # single-state numpy pass), whatever the class count: the same bits as the loop.
    rnd = random.Random(classes)
    workload = random_workload(rnd, classes)
    for _ in range(200):
        memo = FragmentationMemo(workload)
        cards = rnd.choice([1, 2, 4, 8])
        free = tuple(sorted(rnd.choice([0, 1, 60, 230, 500, 1000]) for _ in range(cards)))
        cpu = rnd.choice([0, 999, 1000, 4000, 12000, 40000])
        model = rnd.choice(MODELS)
        memo.prefetch([(cpu, free, model)])
        exact = node_fragment_milli(cpu, free, model, workload)
        if classes >= 64:  # enough cells for numpy: computed by the prefetch
            assert memo._cache[(cpu, free, model)] == exact
        assert memo.fragment(cpu, free, model) == exact


def test_classes_of_one_shape_share_their_levelled_scores_and_growths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A levelled value reads the pod's CPU only through the level after it lands, so a class
    # of the same shape asking other CPU but meeting the same (before, after) levels is
    # served by a lookup; one whose CPU moves the after level is computed. Every value is
    # the one an engine with exact keys computes. Class CPU requests 0 and 4000: levels 0
    # and 4000 (-1 below).
    workload = SHARE_AND_CPU_ONLY
    nodes = [
        NodeState("big", 96000, 96000, 262144, "T4", (GpuState(0, 1000), GpuState(1, 300))),
        NodeState("small", 96000, 6000, 262144, "T4", (GpuState(0, 1000), GpuState(1, 700))),
    ]
    engine = PlacementEngine(nodes, "kubegpu", workload)
    scorer = engine.node_scorer
    fgd = scorer.fgd
    computed = levels_computed(fgd, monkeypatch)
    exact = FgdScorer(engine, FragmentationMemo(workload))
    both = np.array([0, 1])

    def share(cpu: int) -> list[int]:
        pod = PodRequest(cpu, 1024, 1, 500, name=f"share-{cpu}")
        got = fgd.scores(pod, both).tolist()
        assert got == exact.scores(pod, both).tolist(), cpu
        return got

    share(1000)  # both nodes: levels (4000, 4000)
    assert computed == [(4000, 4000), (4000, 4000)]
    share(2000)  # 94000 and 4000 free after: level 4000 again, both looked up
    assert computed == [(4000, 4000), (4000, 4000)]
    share(3000)  # small: 3000 free after is level 0, computed; big is looked up
    assert computed == [(4000, 4000), (4000, 4000), (4000, 0)]

    # A CPU-only pod's growth bucket likewise, per CPU-only shape.
    computed.clear()

    def growth(cpu: int) -> list[float]:
        pod = PodRequest(cpu, 1024, name=f"cpu-{cpu}")
        got = scorer._growth_bucket(pod, both).tolist()
        fresh = PlacementEngine(nodes, "kubegpu", workload).node_scorer
        assert got == fresh._growth_bucket(pod, both).tolist(), cpu
        return got

    growth(3000)  # small: 6000 → 3000 crosses from level 4000 to 0 (big stays: no fragment)
    assert computed == [(4000, 0)]
    growth(2500)  # small: 3500, level 0 again: looked up
    assert computed == [(4000, 0)]
