"""FGD's typical pods on a model-constrained trace: classes keyed by ``gpu_spec`` as written.

The paper's simulator counts ``A|B|B`` and ``A|B`` as two classes (it keys its map by the raw
annotation), while feasibility reads either as the set {A, B}. The worked example below is
small enough to check by hand.

Trace (20 pods): 16 × X = (1000 mCPU, 500 milli, 1 card, any model), 2 × (1000, 500, 1,
``A|B``), 1 × (1000, 500, 1, ``A|B|B``), 1 × Y = (2000, 1000, 1, any model).

FGD keeps the most popular classes until they cover 95 % = 19 pods, ties in count broken by
the class tuple, descending:

* keyed as written: X 16, ``A|B`` 2, then the two classes of 1, Y (cpu 2000) before
  ``A|B|B`` (cpu 1000): 16 + 2 + 1 = 19, so ``A|B|B`` is dropped; weights 16/19, 2/19, 1/19.
* merged as sets (the old, wrong key): X 16, {A, B} 3 = 19, so Y is dropped; 16/19, 3/19.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.policies import get_policy
from kubegpu.simulate.replay import target_workload
from kubegpu.simulate.traces import TracePod, load_pods

TRACE = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
    [f"x-{i},1000,1024,1,500,\n" for i in range(16)]
    + ["ab-0,1000,1024,1,500,A|B\n", "ab-1,1000,1024,1,500,A|B\n"]
    + ["abb-0,1000,1024,1,500,A|B|B\n", "y-0,2000,1024,1,1000,\n"]
)


@pytest.fixture
def trace(tmp_path: Path) -> list[TracePod]:
    path = tmp_path / "pods.csv"
    path.write_text(TRACE)
    return load_pods(path)


def test_trace_pods_keep_their_spec_as_written_and_allow_the_set(trace: list[TracePod]) -> None:
    abb = next(p for p in trace if p.name == "abb-0")
    assert abb.gpu_spec == "A|B|B"
    assert abb.request.gpu_models == frozenset({"A", "B"})


def test_fgd_counts_each_spelling_of_a_model_set_as_its_own_class(
    trace: list[TracePod],
) -> None:
    workload = target_workload(get_policy("fgd"), trace)
    classes = [(t.cpu_milli, t.gpu_milli, t.gpu_count, t.gpu_models) for t in workload.pods]
    assert classes == [
        (1000, 500, 1, frozenset()),
        (1000, 500, 1, frozenset({"A", "B"})),  # "A|B" alone: 2 pods, not 3
        (2000, 1000, 1, frozenset()),  # Y kept, "A|B|B" dropped
    ]
    assert [t.weight for t in workload.pods] == pytest.approx([16 / 19, 2 / 19, 1 / 19])


def test_fgd_places_by_the_classes_as_written(trace: list[TracePod]) -> None:
    # Two nodes of model C (neither A nor B), ample CPU. A 500-milli share of class X:
    #   n0 (rank 0), cards (1000):     F = 1000·2/19 (A|B, no access)              = 105.3
    #     after (500):                 F = 500·2/19 + 500·1/19 (Y no longer fits)  =  78.9
    #     ΔF = −26.3 → score trunc(100·σ(0.0263)) = 50
    #   n1 (rank 1), cards (1000, 500): F = 1500·2/19 + 500·1/19 (card too small for Y) = 184.2
    #     share on the 500 card → (1000, 0): F = 1000·2/19                        = 105.3
    #     ΔF = −78.9 → score trunc(100·σ(0.0789)) = 51
    # so FGD takes n1. With the classes merged (Y dropped, {A,B} at 3/19) both nodes score
    # 51 (ΔF = −1500/19 on each) and rank 0, n0, would win.
    nodes = [
        NodeState("n0", 64_000, 64_000, 256_000, "C", (GpuState(0, 1000),), rank=0),
        NodeState(
            "n1", 64_000, 64_000, 256_000, "C", (GpuState(0, 1000), GpuState(1, 500)), rank=1
        ),
    ]
    engine = PlacementEngine(nodes, "fgd", target_workload(get_policy("fgd"), trace))
    share = PodRequest(1000, 1024, 1, 500)
    assert engine.score(share) == {"n0": 50, "n1": 51}
    placement = engine.choose(share)
    assert placement is not None
    assert (placement.node, placement.gpu_indices) == ("n1", (1,))
