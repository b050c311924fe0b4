"""Our policy per GPU model: gap tables, share sizes, CPU ratio and pressure seen from each
model, against values worked out by hand, and what it changes in placement."""

from __future__ import annotations

import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalPod, TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.waste import ModelWaste, WastePotential, gap_waste_table

# Half the pods: a 500-milli share with 4000 mCPU, any model. Half: a 300-milli share with
# 1000 mCPU, T4 only. Two T4 cards and two G2 cards.
WORKLOAD = TypicalWorkload(
    (
        TypicalPod(4000, 500, 1, frozenset(), 0.5),
        TypicalPod(1000, 300, 1, frozenset({"T4"}), 0.5),
    )
)
CAPACITY = {"T4": 2000, "G2": 2000}


def test_each_model_sees_the_classes_that_may_use_it_weighted_by_where_they_land() -> None:
    # The free class spreads by capacity: half its demand on T4 (weight 0.25), half on G2.
    # T4 sees 300 at 0.5 and 500 at 0.25: 85 % of that needs both sizes; G2 sees 500 only.
    waste = ModelWaste.build(WORKLOAD, CAPACITY)
    t4, g2 = waste.index("T4"), waste.index("G2")
    assert (waste.potentials[t4].gap_waste == gap_waste_table([300, 500])).all()
    assert (waste.potentials[g2].gap_waste == gap_waste_table([500])).all()
    # ρ: (0.25·4000 + 0.5·1000) / (0.25·500 + 0.5·300) on T4, 4000 / 500 on G2.
    assert waste.rho[t4] == pytest.approx(1500 / 275)
    assert waste.rho[g2] == pytest.approx(8.0)


def test_pressure_is_the_share_of_a_models_capacity_that_limited_pods_need() -> None:
    # Demand per unit weight: 0.5·500 + 0.5·300 = 400, of which 150 can only use T4. At a
    # full cluster (4000 milli) that is 1500 milli of T4's 2000: pressure 0.75; G2: 0.
    waste = ModelWaste.build(WORKLOAD, CAPACITY)
    assert waste.pressure[waste.index("T4")] == pytest.approx(0.75)
    assert waste.pressure[waste.index("G2")] == 0.0
    # More limited demand than the model holds: capped at 1.
    crowded = ModelWaste.build(WORKLOAD, {"T4": 1000, "G2": 9000})
    assert crowded.pressure[crowded.index("T4")] == 1.0


def test_a_workload_without_model_limits_is_the_pooled_potential_exactly() -> None:
    free = TypicalWorkload((TypicalPod(4000, 500, 1, frozenset(), 1.0),))
    waste = ModelWaste.build(free, CAPACITY)
    assert waste.models == ()
    assert waste.index("T4") == waste.index("G2") == 0
    pooled = WastePotential.from_workload(free)
    assert (waste.potentials[0].gap_waste == pooled.gap_waste).all()
    assert waste.pressure.tolist() == [0.0]


def node(name: str, model: str, rank: int) -> NodeState:
    cards = tuple(GpuState(i) for i in range(2))
    return NodeState(name, 64_000, 64_000, 256_000, model, cards, rank=rank)


def test_a_pod_free_to_go_anywhere_pays_the_pressure_of_the_model_it_takes() -> None:
    # Whole-card pods, half of them T4-only; 2 T4 and 2 G2 cards. T4's pressure:
    # 0.5·1000 of every 1000 of demand can only use T4, at a full cluster 2000 milli of its
    # 2000: 1.0. A free whole card costs 1000·1.0 = 25 buckets of 40 on T4, 0 on G2, so it
    # goes to G2 although T4 ranks first.
    workload = TypicalWorkload(
        (
            TypicalPod(1000, 1000, 1, frozenset(), 0.5),
            TypicalPod(1000, 1000, 1, frozenset({"T4"}), 0.5),
        )
    )
    nodes = [node("t4", "T4", 0), node("g2", "G2", 1)]
    free_pod = PodRequest(1000, 1024, 1, 1000)
    ours = PlacementEngine(nodes, "kubegpu", workload)
    rows = ours.feasible_rows(free_pod)
    assert ours.node_scorer.keys(free_pod, rows)[0].tolist() == [25.0, 0.0]
    assert ours.choose(free_pod).node == "g2"  # type: ignore[union-attr]
    # A share pays in proportion: its 500-milli gap (no share class could fill it) plus,
    # on T4, 500 of pressure: 1000 → 25 buckets on T4, 500 → 12 on G2.
    share = PodRequest(1000, 1024, 1, 500)
    assert ours.node_scorer.keys(share, ours.feasible_rows(share))[0].tolist() == [25.0, 12.0]
    # The T4-only pod has one place to go, pressure or not.
    t4_pod = PodRequest(1000, 1024, 1, 1000, gpu_models=frozenset({"T4"}))
    assert ours.choose(t4_pod).node == "t4"  # type: ignore[union-attr]
