"""Feasibility with reasons, incremental allocation, and the engine's by-name API."""

from __future__ import annotations

import gc
import weakref

import pytest

from kubegpu.placement import state as state_module
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest

WORKLOAD = TypicalWorkload.from_pods([PodRequest(1000, 0, 1, 500)])


def cluster() -> list[NodeState]:
    return [
        NodeState(
            "node-a",
            32_000,
            32_000,
            128_000,
            "T4",
            (GpuState(0, 1000, 6144), GpuState(1, 400, 4096)),
        ),
        NodeState("node-b", 32_000, 32_000, 128_000, "V100M32", (GpuState(0, 1000, 32768),)),
        NodeState("node-c", 32_000, 500, 128_000, "T4", (GpuState(0, 1000, 16384),)),
    ]


def test_infeasible_nodes_come_with_a_reason_naming_node_and_numbers() -> None:
    eng = PlacementEngine(cluster(), "fgd", WORKLOAD)
    pod = PodRequest(1000, 1024, 1, 300, gpu_memory_mib=10240, name="train-0")
    fits = {f.node: f for f in eng.filter(pod)}
    assert fits["node-b"].fits
    assert not fits["node-a"].fits
    assert fits["node-a"].reason == "node-a: largest free card has 6144 MiB, pod needs 10240 MiB"
    assert fits["node-c"].reason == "node-c: 500 milli-CPU free, pod needs 1000"


def test_whole_card_shortfall_and_model_mismatch_are_explained() -> None:
    eng = PlacementEngine(cluster(), "bestfit")
    two = PodRequest(1000, 1024, 2, 1000)
    assert eng.explain("node-b", two).reason == "node-b: needs 2 whole GPUs, 1 free"
    v100 = PodRequest(1000, 1024, 1, 500, gpu_models=frozenset({"V100M32"}))
    assert eng.explain("node-a", v100).reason == "node-a: GPU model T4, pod allows V100M32"
    assert eng.score(v100) == {"node-b": 0}


def test_gpu_memory_requests_steer_card_choice_to_cards_with_enough_memory() -> None:
    eng = PlacementEngine(cluster(), "fgd", WORKLOAD)
    pod = PodRequest(1000, 1024, 1, 300, gpu_memory_mib=10240)
    # Without a memory need FGD fills the 400-milli card (its leftover is fragment anyway) ...
    assert eng.pick_gpus("node-a", PodRequest(1000, 1024, 1, 300)) == (1,)
    # ... but that card has only 4096 MiB free.
    assert eng.pick_gpus("node-a", PodRequest(1000, 1024, 1, 300, gpu_memory_mib=5000)) == (0,)
    with pytest.raises(ValueError, match="6144 MiB"):
        eng.pick_gpus("node-a", PodRequest(1000, 1024, 1, 600, gpu_memory_mib=10240))
    assert eng.choose(pod) is not None


def test_allocate_then_release_restores_the_node_exactly() -> None:
    eng = PlacementEngine(cluster(), "fgd", WORKLOAD)
    before = eng.node_state("node-a")
    pod = PodRequest(2000, 4096, 1, 300, gpu_memory_mib=2048)
    eng.allocate("node-a", pod, (1,))
    during = eng.node_state("node-a")
    assert during.cpu_free_milli == 30_000
    assert during.gpus[1] == GpuState(1, 100, 2048)
    assert during.affinity_counts == {"share-gpu": 1}
    eng.release("node-a", pod, (1,))
    after = eng.node_state("node-a")
    assert after == before and after.affinity_counts == {}


def test_node_state_values_allocate_like_the_engine() -> None:
    state = cluster()[0]
    pod = PodRequest(2000, 4096, 1, 300, gpu_memory_mib=2048)
    eng = PlacementEngine([state], "bestfit")
    eng.allocate("node-a", pod, (1,))
    by_value = state.with_allocation(pod, (1,))
    assert eng.node_state("node-a").gpus == by_value.gpus
    assert by_value.without_allocation(pod, (1,)).gpus == state.gpus


def test_overcommitting_a_card_is_refused() -> None:
    eng = PlacementEngine(cluster(), "bestfit")
    with pytest.raises(ValueError, match="card 1"):
        eng.allocate("node-a", PodRequest(1000, 0, 1, 500), (1,))


def test_place_binds_so_the_next_pod_sees_the_smaller_node() -> None:
    eng = PlacementEngine(cluster()[1:2], "bestfit")
    first = eng.place(PodRequest(1000, 0, 1, 700))
    assert first is not None and first.gpu_indices == (0,)
    assert eng.place(PodRequest(1000, 0, 1, 700)) is None
    assert eng.gpu_used_milli == 700


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_count": 0, "gpu_milli": 500}, "without a GPU count"),
        ({"gpu_count": 2, "gpu_milli": 500}, "whole cards"),
        ({"gpu_count": 1, "gpu_milli": 1500}, r"\(0, 1000\]"),
    ],
)
def test_inconsistent_requests_are_rejected(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodRequest(1000, 0, **kwargs)


def test_fgd_without_a_target_workload_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="target workload"):
        PlacementEngine(cluster(), "fgd")


def test_one_shot_helpers_agree_with_a_long_lived_engine() -> None:
    from kubegpu.placement.engine import filter_nodes, pick_gpus, score_nodes

    pod = PodRequest(1000, 1024, 1, 300)
    eng = PlacementEngine(cluster(), "kubegpu", WORKLOAD)
    assert score_nodes(cluster(), pod, "kubegpu", WORKLOAD) == eng.score(pod)
    assert filter_nodes(cluster(), pod) == eng.filter(pod)
    assert pick_gpus(cluster()[0], pod, "kubegpu", WORKLOAD) == eng.pick_gpus("node-a", pod)


def test_update_node_replaces_a_rows_free_resources_in_place() -> None:
    eng = PlacementEngine(cluster(), "kubegpu", WORKLOAD)
    fresh = cluster()[1].with_allocation(PodRequest(4000, 1024, 1, 700), (0,))
    eng.update_node(fresh)
    assert eng.node_state("node-b").gpus == fresh.gpus
    assert eng.node_state("node-b").affinity_counts == {"share-gpu": 1}
    assert "node-b" not in eng.score(PodRequest(1000, 0, 1, 500))
    with pytest.raises(ValueError, match="rebuild"):
        eng.update_node(NodeState("node-b", 32_000, 32_000, 1, "T4", fresh.gpus))


def test_a_retired_engine_goes_by_reference_count() -> None:
    # The extender replaces its engine every workload refresh; its scorers hold it, so without
    # retire() it waited for a full cyclic collection, a pause of every verb (issue 32).
    node = NodeState("n", 64000, 64000, 1 << 20, "A100", tuple(GpuState(j) for j in range(4)))
    pod = PodRequest(1000, 1024, 1, 300)
    workload = TypicalWorkload.from_pods([pod])
    for policy in ("kubegpu", "fgd", "bestfit"):
        enabled = gc.isenabled()
        gc.disable()
        try:
            kept = PlacementEngine([node], policy, workload)
            kept.place(pod)
            unretired = weakref.ref(kept)
            del kept
            assert unretired() is not None, policy  # the cycle: only a collection frees it
            engine = PlacementEngine([node], policy, workload)
            engine.place(pod)
            retired = weakref.ref(engine)
            engine.retire()
            del engine
            assert retired() is None, policy
        finally:
            if enabled:
                gc.enable()
            gc.collect()


def test_a_retired_engine_lets_its_states_go_a_few_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a pace, the states the engine met are freed in steps, the pace called between
    (the extender's background retirement steps aside for the verbs there)."""
    monkeypatch.setattr(state_module, "STATES_PER_PACE", 2)
    node = NodeState("n", 64000, 64000, 1 << 20, "A100", tuple(GpuState(j) for j in range(4)))
    pod = PodRequest(1000, 1024, 1, 300)
    engine = PlacementEngine([node], "kubegpu", TypicalWorkload.from_pods([pod]))
    for _ in range(5):  # each placement is a new state of the node
        assert engine.place(pod) is not None
    met = len(engine.state_keys)
    assert met == 6
    paces: list[int] = []
    keys = engine.state_keys
    engine.retire(lambda: paces.append(len(keys)))
    assert paces == [4, 2, 0]  # two states let go per step
    assert engine.state_keys == [] and not hasattr(engine, "node_scorer")
