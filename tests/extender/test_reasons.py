"""The vectorised rejection reasons say exactly what the engine's own ``explain`` says, on
random cluster states and pods; their metric labels are what ``reason_category`` reads from
the strings; remembered structural reasons equal freshly formatted ones, also after a node's
facts change."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kubegpu.extender.reasons import (
    EXPLAIN_CATEGORIES,
    STRUCTURAL_CATEGORIES,
    NodeFacts,
    ReasonCache,
    explain_rows,
    explain_rows_coded,
    structural,
)
from kubegpu.extender.scheduler import reason_category
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.sharing.accounting import NodeInfo
from kubegpu.sharing.annotations import GpuRecord, NodeGpuInventory
from kubegpu.sharing.resources import GpuRequest, RequestKind


def random_cluster(rng: random.Random) -> list[NodeState]:
    nodes = []
    for i in range(60):
        cards = rng.choice([0, 1, 2, 4, 8])
        mixed = rng.random() < 0.3  # cards of random models (on the card), as on mixed nodes
        gpus = tuple(
            GpuState(
                j,
                rng.choice([0, 100, 400, 700, 1000]),
                rng.choice([0, 2048, 8192, 40960]),
                rng.choice(["A100", "T4", "V100"]) if mixed else "",
            )
            for j in range(cards)
        )
        nodes.append(
            NodeState(
                f"n{i:02d}",
                64000,
                rng.choice([0, 1000, 8000, 64000]),
                rng.choice([0, 4096, 262144]),
                rng.choice(["A100", "T4"]),
                gpus,
            )
        )
    return nodes


def random_pod(rng: random.Random) -> PodRequest:
    cpu, memory = rng.choice([500, 4000, 16000]), rng.choice([512, 8192])
    models = rng.choice([frozenset(), frozenset({"T4"}), frozenset({"T4", "V100"})])
    shape = rng.random()
    if shape < 0.2:
        return PodRequest(cpu, memory)
    if shape < 0.6:
        return PodRequest(
            cpu, memory, 1, rng.choice([100, 500, 900]), rng.choice([None, 1024, 16384]), models
        )
    return PodRequest(cpu, memory, rng.choice([1, 2, 4]), 1000, None, models)


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_reasons_equal_the_engines_explain(seed: int) -> None:
    rng = random.Random(seed)
    engine = PlacementEngine(random_cluster(rng), "bestfit")
    for _ in range(25):
        pod = random_pod(rng)
        feasible = set(engine.feasible_rows(pod).tolist())
        rows = np.array([i for i in range(len(engine.names)) if i not in feasible], dtype=np.int64)
        expected = [engine.explain(engine.names[i], pod).reason for i in rows.tolist()]
        assert explain_rows(engine, pod, rows) == expected


@pytest.mark.parametrize("seed", range(10))
def test_explain_codes_give_the_label_reason_category_reads_from_the_reason(seed: int) -> None:
    rng = random.Random(seed)
    engine = PlacementEngine(random_cluster(rng), "bestfit")
    for _ in range(25):
        pod = random_pod(rng)
        feasible = set(engine.feasible_rows(pod).tolist())
        rows = np.array([i for i in range(len(engine.names)) if i not in feasible], dtype=np.int64)
        reasons, codes = explain_rows_coded(engine, pod, rows)
        assert reasons == explain_rows(engine, pod, rows)
        for reason, code in zip(reasons, codes.tolist(), strict=True):
            assert EXPLAIN_CATEGORIES[code] == reason_category(reason or "n: does not fit")


def random_info(rng: random.Random, name: str) -> NodeInfo:
    shape = rng.random()
    if shape < 0.1:
        return NodeInfo(name, 64000, 262144)  # no inventory published
    if shape < 0.15:
        return NodeInfo(name, 64000, 262144, inventory_error="annotation is not JSON")
    cards = tuple(
        GpuRecord(
            f"GPU-{name}-{i}",
            i,
            rng.choice(["A100", "T4", "V100"]),
            rng.choice([15360, 40960, 81920]),
            rng.random() > 0.2,
        )
        for i in range(rng.choice([0, 1, 2, 4, 8]))
    )
    return NodeInfo(name, 64000, 262144, NodeGpuInventory(cards))


def random_request(rng: random.Random) -> GpuRequest:
    models = rng.choice([frozenset(), frozenset({"T4"}), frozenset({"A100", "H100"})])
    if rng.random() < 0.5:
        return GpuRequest(
            RequestKind.WHOLE, 1000, 1024, whole_gpus=rng.choice([1, 2, 4, 8]), gpu_models=models
        )
    return GpuRequest(
        RequestKind.SHARED,
        1000,
        1024,
        compute_milli=rng.choice([100, 500]),
        gpu_memory_mib=rng.choice([1024, 20480, 50000, 90000]),
        gpu_models=models,
    )


@pytest.mark.parametrize("seed", range(10))
def test_remembered_structural_reasons_equal_fresh_ones_as_facts_change(seed: int) -> None:
    rng = random.Random(seed)
    states = [NodeState(f"n{i:02d}", 64000, 64000, 262144, "T4") for i in range(40)]
    engine = PlacementEngine(states, "bestfit")
    infos = {name: random_info(rng, name) for name in engine.names}
    facts = NodeFacts.build(engine, infos)
    requests = [random_request(rng) for _ in range(6)]
    for _ in range(30):
        request = rng.choice(requests)
        rows = np.arange(len(engine.names), dtype=np.int64)
        never = rows[facts.never_fits(rows, request)]
        names = [engine.names[i] for i in never.tolist()]
        fresh = [
            structural(facts, i, name, request)
            for i, name in zip(never.tolist(), names, strict=True)
        ]
        assert all(fresh)
        assert facts.structural_reasons(never, names, request) == fresh
        labels = [STRUCTURAL_CATEGORIES[c] for c in facts.structural_codes(never, request).tolist()]
        assert labels == [reason_category(reason) for reason in fresh]
        # A node's inventory, health or memory changes (or only its usage: same facts).
        changed = rng.choice(engine.names)
        infos[changed] = random_info(rng, changed) if rng.random() < 0.7 else infos[changed]
        facts.update(engine.row_of(changed), changed, infos[changed])


@pytest.mark.parametrize("seed", range(10))
def test_remembered_reasons_equal_fresh_ones_as_nodes_fill_and_empty(seed: int) -> None:
    rng = random.Random(seed)
    engine = PlacementEngine(random_cluster(rng), "bestfit")
    versions = np.zeros(len(engine.names), dtype=np.int64)
    cache = ReasonCache(len(engine.names), shapes=4)  # fewer shapes than pods: evictions too
    shapes = [random_pod(rng) for _ in range(6)]
    placed: list[tuple[int, PodRequest, tuple[int, ...]]] = []
    for _ in range(60):
        pod = rng.choice(shapes)
        feasible = set(engine.feasible_rows(pod).tolist())
        rows = np.array([i for i in range(len(engine.names)) if i not in feasible], dtype=np.int64)
        reasons, codes = cache.explain(engine, pod, rows, versions)
        fresh, fresh_codes = explain_rows_coded(engine, pod, rows)
        assert reasons == fresh and codes.tolist() == fresh_codes.tolist()
        # Between decisions the cluster changes: a pod lands or leaves, and its row's
        # version moves on (as the scheduler's row rewrite does).
        if placed and rng.random() < 0.3:
            row, gone, cols = placed.pop(rng.randrange(len(placed)))
            engine.release_row(row, gone, cols)
        else:
            extra = random_pod(rng)
            found = engine.feasible_rows(extra)
            if found.size == 0:
                continue
            row = int(found[rng.randrange(found.size)])
            cols = engine.pick_columns(row, extra)
            engine.allocate_row(row, extra, cols)
            placed.append((row, extra, cols))
        versions[row] += 1


def test_structural_reasons_on_a_mixed_node_count_only_the_allowed_models_cards() -> None:
    cards = (
        GpuRecord("GPU-v0", 0, "V100", 16384),
        GpuRecord("GPU-v1", 1, "V100", 16384),
        GpuRecord("GPU-t2", 2, "T4", 15360),
        GpuRecord("GPU-t3", 3, "T4", 15360),
        GpuRecord("GPU-a4", 4, "A100", 81920, healthy=False),
    )
    engine = PlacementEngine([NodeState("node-m", 64000, 64000, 262144)], "bestfit")
    facts = NodeFacts.build(
        engine, {"node-m": NodeInfo("node-m", 64000, 262144, NodeGpuInventory(cards))}
    )
    rows = np.array([0], dtype=np.int64)

    def reason(request: GpuRequest) -> str:
        assert bool(facts.never_fits(rows, request)[0]) == bool(
            structural(facts, 0, "node-m", request)
        )
        return structural(facts, 0, "node-m", request)

    v100 = frozenset({"V100"})
    assert reason(GpuRequest(RequestKind.WHOLE, 1000, 1024, whole_gpus=2, gpu_models=v100)) == ""
    assert reason(GpuRequest(RequestKind.WHOLE, 1000, 1024, whole_gpus=3, gpu_models=v100)) == (
        "node-m: has 2 healthy GPUs of model V100, pod needs 3 whole GPUs"
    )
    # Without a model all four healthy cards count; the unhealthy A100 counts for nothing.
    assert reason(GpuRequest(RequestKind.WHOLE, 1000, 1024, whole_gpus=4)) == ""
    assert (
        reason(
            GpuRequest(RequestKind.WHOLE, 1000, 1024, whole_gpus=1, gpu_models=frozenset({"A100"}))
        )
        == "node-m: GPU models T4,V100, pod allows A100"
    )
    t4_share = GpuRequest(
        RequestKind.SHARED,
        1000,
        1024,
        compute_milli=100,
        gpu_memory_mib=16000,
        gpu_models=frozenset({"T4"}),
    )
    assert (
        reason(t4_share)
        == "node-m: largest card of model T4 has 15360 MiB in total, pod needs 16000 MiB"
    )
    assert STRUCTURAL_CATEGORIES[int(facts.structural_codes(rows, t4_share)[0])] == "gpu-memory"
