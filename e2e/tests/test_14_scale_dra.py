"""The DRA column of the scale replay at small scale (issue 27, item 3; the CI version of
`e2e/run --bench-scale --dra`): the 100 KWOK nodes and the pods of test_12's generated trace, in
the same arrival order, with each pod's GPUs asked through a ResourceClaim from a template and
allocated by kube-scheduler's own DRA allocator (consumable capacity) from kubegpu's slices
(``kubegpu_e2e/scale/dra.py``): DRA's first fit through the default scheduler, with kubegpu's
steering, with steering and the extender's `/prioritize-dra` ranking, and with the ranking
alone. Every pod settles, no device's capacity is over-allocated, the claims account for every
bound pod's GPUs and nothing else, steering never loses where the node choice is fixed (under
the ranking), and the ranked variants reach the simulator's DRA figures within 0.3 pp. Runs on
its own control plane with DRA's gates (no kubelet), after test_13."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import _results, started_scale_cluster
from kubegpu_e2e.scale import dra, trace
from kubegpu_e2e.scale.dra import VARIANTS, DraRun, DraScaleCluster

E2E = Path(__file__).resolve().parents[1]
SEED = 42
# The variants in the order they run (each on empty nodes: the last one's pods and claims are
# deleted first).
ORDER = ("first-fit", "steered", "ranked", "steered-ranked")


@pytest.fixture(scope="module")
def scale_dra(small_trace: trace.ReplayTrace) -> Iterator[DraScaleCluster]:
    yield from started_scale_cluster(
        DraScaleCluster, "scale-dra", "scale DRA cluster start", small_trace
    )


@pytest.fixture(scope="module")
def runs() -> dict[str, DraRun]:
    return {}


@pytest.mark.parametrize("variant", ORDER)
def test_dra_replay_variant(
    scale_dra: DraScaleCluster,
    small_trace: trace.ReplayTrace,
    runs: dict[str, DraRun],
    variant: str,
) -> None:
    run = asyncio.run(scale_dra.run_variant(small_trace, VARIANTS[variant]))
    runs[variant] = run
    summary = run.summary()
    _results.setdefault(f"scale DRA replay {variant}", {}).update(summary)
    print(summary)
    # Every pod settled, once: bound or refused at its turn, none bound later.
    assert summary["bound"] + summary["refused"] == len(small_trace.pods), summary
    assert summary["late_binds"] == 0, run.outcome.late_binds[:5]
    # The allocator's accounting holds on every device, and no claim is allocated for a pod
    # that was not bound.
    assert run.overallocated == [], run.overallocated[:5]
    assert run.unbound_with_claim == [], run.unbound_with_claim[:5]
    # One claim per GPU pod, allocated exactly for the bound ones, consuming what those pods
    # ask after the request policy's rounding.
    gpu_pods = [p for p in small_trace.pods if p.gpu_count]
    bound = {p.name for p in run.outcome.pods if p.result == "bound"}
    assert run.claims.claims == len(gpu_pods)
    assert run.claims.allocated == sum(1 for p in gpu_pods if p.name in bound)
    assert float(run.claims.consumed_milli) == run.rounded_milli
    assert 0 < run.ratio <= 100.0


def test_steering_never_loses_to_first_fit_and_the_figures_are_reported(
    small_trace: trace.ReplayTrace, runs: dict[str, DraRun]
) -> None:
    missing = [v for v in ORDER if v not in runs]
    if missing:
        pytest.skip(f"variants that did not run: {missing}")
    simulated = dra.simulated_card_choices(small_trace, SEED)
    ratios = {v: round(runs[v].ratio, 3) for v in ORDER}
    full = simulated["policy"]
    report = {
        "real_allocation_pct": ratios,
        "simulated_allocation_pct": simulated,
        "steered_recovers_of_first_fit_loss": dra.gap_closed(
            ratios["steered"], ratios["first-fit"], full
        ),
        "steered_ranked_recovers_of_first_fit_loss": dra.gap_closed(
            ratios["steered-ranked"], ratios["first-fit"], full
        ),
        "steering_recovers_under_ranking": dra.gap_closed(
            ratios["steered-ranked"], ratios["ranked"], full
        ),
        "ranked_recovers_of_blind_first_fit_loss": dra.gap_closed(
            ratios["ranked"], simulated[dra.BLIND_FIRST_FIT], full
        ),
    }
    _results.setdefault("scale DRA side by side", {}).update(report)
    print(report)
    # Steering changes the card, not the node. Without the extender the default scheduler
    # breaks equal node scores at random (selectHost's reservoir sampling), so first-fit and
    # steered each land on different nodes from run to run, and one against the other is a
    # draw: 94.675 / 95.325 in one run, 95.606 / 94.567 in the next on the same code. Under the
    # ranking the node choice is fixed (the extender's scores break every tie), so there the
    # card choice is all that differs, and steering must not lose.
    assert ratios["steered-ranked"] >= ratios["ranked"], ratios
    assert ratios["steered-ranked"] >= ratios["first-fit"], ratios
    # The extender's ranking (pricing the card the allocator takes in each slice's order, as
    # the simulator's DRA engine does) gives the simulator's figure on the real allocator.
    assert abs(ratios["ranked"] - simulated["first-fit"]) <= 0.3, (ratios, simulated)
    assert abs(ratios["steered-ranked"] - simulated["steered"]) <= 0.3, (ratios, simulated)
