"""07-Kubegpu prices the one or two nodes whose state is new since a pod class last came in
Python floats (``ModelWaste.*_one``, ``KubegpuScorer._share_choice_scalar``, a share's best
card from its state's sorted free milli); numpy prices
the rest. Both must give the same bucket and the same card on every node, or a placement
would depend on how many nodes happened to be new."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalPod, TypicalWorkload
from kubegpu.placement.policies import kubegpu as kubegpu_policy
from kubegpu.placement.waste import ModelWaste, WasteWeights
from tests.placement.test_kubegpu_caches import random_node, random_pod

MODELS = ("A100", "T4", "V100")


def random_waste(rng: random.Random, constrained: bool) -> ModelWaste:
    """A pooled waste (no model limits) or one per model, with pressure, and a model whose
    pods ask no CPU (its ρ is NaN: nothing counts as stranded there)."""
    pods: list[TypicalPod] = []
    for _ in range(12):
        count = rng.choice([0, 1, 1, 2])
        milli = 0 if not count else (rng.choice([60, 250, 500, 810]) if count == 1 else 1000)
        # Constrained: every GPU pod limited to T4 or V100 (or both), so that A100 is asked
        # for only by the CPU-less pod added below.
        models = frozenset(rng.choice([["T4"], ["V100"], ["T4", "V100"]])) if constrained else None
        pods.append(
            TypicalPod(
                rng.choice([0, 1500, 8000, 12000]),
                milli,
                count,
                (models if count else None) or frozenset(),
                rng.choice([1.0, 2.0, 5.0]),
            )
        )
    if constrained:  # A100's pods ask no CPU: its ρ is NaN
        pods.append(TypicalPod(0, 500, 1, frozenset({"A100"}), 3.0))
    total = sum(p.weight for p in pods)
    workload = TypicalWorkload(
        tuple(
            TypicalPod(p.cpu_milli, p.gpu_milli, p.gpu_count, p.gpu_models, p.weight / total)
            for p in pods
        )
    )
    weights = WasteWeights(cpu_weight=rng.choice([0.75, 0.5, 1.3]))
    return ModelWaste.build(workload, {"A100": 8000, "T4": 16000, "V100": 4000}, weights)


@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_one_node_in_python_floats_prices_what_numpy_prices(seed: int, constrained: bool) -> None:
    rng = random.Random(seed)
    waste = random_waste(rng, constrained)
    assert (len(waste.potentials) > 1) == constrained
    if constrained:
        assert np.isnan(waste.rho[waste.index("A100")])
    entries = len(waste.potentials)
    for _ in range(400):
        cards = rng.choice([1, 2, 4, 8])
        free = [rng.choice([0, 1, 60, 190, 250, 500, 999, 1000]) for _ in range(cards)]
        # Free CPU from none to plenty, and fractions, as the engine's float64 columns hold.
        cpu = float(rng.choice([0, 1, 999, 4000, 12345, 96000]) + rng.random() * 3)
        gpu = float(sum(free))
        entry = rng.randrange(entries)
        e = np.array([entry])
        taken_cpu = rng.choice([0, 500, 4000])
        taken_gpu = rng.choice([0, 250, 1000, 2000])
        vector = waste.stranded_buckets(e, np.array([gpu]), np.array([cpu]), taken_gpu, taken_cpu)
        one = waste.stranded_bucket_one(entry, gpu, cpu, taken_gpu, taken_cpu)
        assert one == vector[0], (entry, gpu, cpu, taken_gpu, taken_cpu)
        share = rng.choice([60, 250, 500, 810])
        padded = np.array([free + [-1] * (8 - cards)])
        vector_cards = waste.share_buckets(
            e, padded, np.array([gpu]), np.array([cpu]), share, taken_cpu
        )[0]
        one_cards = waste.share_buckets_one(entry, free, gpu, cpu, share, taken_cpu)
        assert one_cards == vector_cards[:cards].tolist(), (entry, free, cpu, share)
        # The best card from the sorted free milli: least bucket, then tightest.
        fits = [(b, f) for b, f in zip(one_cards, free, strict=True) if b != float("inf")]
        best = waste.share_best_one(entry, tuple(sorted(free)), gpu, cpu, share, taken_cpu)
        assert best == (min(fits) if fits else (float("inf"), 0)), (entry, free, cpu, share)


@pytest.mark.parametrize("seed", range(6))
def test_the_scalar_card_choice_is_numpys(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Random clusters with mixed-model nodes, model-limited pods, and pods placed between
    # the checks (so free CPU, gaps and card counts vary): on every set of at most
    # SCALAR_ROWS feasible rows, Python and numpy give the same bucket and card per row.
    rng = random.Random(300 + seed)
    workload = TypicalWorkload.from_pods([random_pod(rng, i) for i in range(60)])
    engine = PlacementEngine([random_node(rng, i) for i in range(40)], "kubegpu", workload)
    scorer = engine.node_scorer
    checked = 0
    for i in range(120):
        pod = random_pod(rng, i)
        rows = engine.feasible_rows(pod)
        if pod.is_gpu_share and pod.gpu_memory_mib is None and rows.size:
            for start in range(0, rows.size, kubegpu_policy.SCALAR_ROWS):
                some = rows[start : start + kubegpu_policy.SCALAR_ROWS]
                scalar = scorer.share_choice(pod, some)
                with monkeypatch.context() as patch:
                    patch.setattr(kubegpu_policy, "SCALAR_ROWS", 0)
                    vector = scorer.share_choice(pod, some)
                assert scalar[0].tolist() == vector[0].tolist(), pod
                assert scalar[1].tolist() == vector[1].tolist(), pod
                checked += 1
            few = rows[: kubegpu_policy.SCALAR_ROWS]
            stranded = scorer._stranded_bucket(pod, few)
            with monkeypatch.context() as patch:
                patch.setattr(kubegpu_policy, "SCALAR_ROWS", 0)
                expected = scorer._stranded_bucket(pod, few)
            assert stranded.tolist() == expected.tolist()
        engine.place(pod)
    assert checked >= 40


def test_rounding_to_six_places_is_numpys_not_pythons() -> None:
    # np.round multiplies by 10⁶ and rounds half to even in binary; Python's round(x, 6)
    # rounds the decimal value correctly. They differ on halfway cases such as these, and
    # the vectorised pricing uses numpy's.
    from kubegpu.placement.waste import numpy_floor, numpy_round6

    rng = random.Random(7)
    values = [32.7937315, -52.3894505, 12.6513965, 0.0, -0.0, np.inf, -np.inf]
    values += [rng.randrange(-(10**9), 10**9) / 10**7 + 5e-7 for _ in range(20000)]
    differs = 0
    for x in values:
        assert numpy_round6(x) == np.round(x, 6), x
        differs += round(x, 6) != np.round(x, 6)
        assert numpy_floor(x / 40.0) == np.floor(x / 40.0), x
    assert differs > 100  # the cases that matter are in the sample
