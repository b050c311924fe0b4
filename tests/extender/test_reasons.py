"""The filter's rejection reasons: the first failing check, computed for many rows at once,
is exactly the engine's own ``explain_row``; its metric label is what ``reason_category`` reads
from the engine's reason; the words kube-scheduler counts name the check and the pod's ask,
never the node, so identical reasons come out identical on every node."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from kubegpu.extender.reasons import (
    EXPLAIN_CATEGORIES,
    STRUCTURAL_CATEGORIES,
    NodeFacts,
    explain_codes,
    phrases_of,
    reason_counts,
    refusal_phrases,
    structural,
    structural_phrases,
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


def rejections(
    seed: int, pods: int = 25
) -> Iterator[tuple[PlacementEngine, PodRequest, npt.NDArray[np.int64]]]:
    """A random cluster, then random pods each with the rows that cannot take it."""
    rng = random.Random(seed)
    engine = PlacementEngine(random_cluster(rng), "bestfit")
    for _ in range(pods):
        pod = random_pod(rng)
        feasible = set(engine.feasible_rows(pod).tolist())
        rows = [i for i in range(len(engine.names)) if i not in feasible]
        yield engine, pod, np.array(rows, dtype=np.int64)


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_checks_equal_the_engines_explain(seed: int) -> None:
    for engine, pod, rows in rejections(seed):
        expected = [engine.explain_row(i, pod)[0] for i in rows.tolist()]
        assert explain_codes(engine, pod, rows).tolist() == expected


@pytest.mark.parametrize("seed", range(10))
def test_explain_codes_give_the_label_reason_category_reads_from_the_engines_reason(
    seed: int,
) -> None:
    for engine, pod, rows in rejections(seed):
        for row, code in zip(rows.tolist(), explain_codes(engine, pod, rows).tolist(), strict=True):
            reason = engine.explain(engine.names[row], pod).reason
            assert EXPLAIN_CATEGORIES[code] == reason_category(reason or "n: does not fit")


@pytest.mark.parametrize("seed", range(10))
def test_filter_reasons_name_no_node_and_one_per_failing_check(seed: int) -> None:
    for engine, pod, rows in rejections(seed):
        codes = explain_codes(engine, pod, rows)
        reasons = phrases_of(refusal_phrases(pod), codes)
        assert len(reasons) == rows.size
        assert all(reasons)
        assert not any(name in reason for name in engine.names for reason in reasons)
        # Nodes failing the same check get the very same words, which kube-scheduler counts.
        by_code: dict[int, set[str]] = {}
        for code, reason in zip(codes.tolist(), reasons, strict=True):
            by_code.setdefault(code, set()).add(reason)
        assert all(len(words) == 1 for words in by_code.values())


def test_filter_reasons_name_the_pods_ask() -> None:
    share = PodRequest(4000, 8192, 1, 300, 10240, frozenset({"T4", "V100"}))
    phrases = refusal_phrases(share)
    assert phrases[0] == "node(s) have less than 4000 milli-CPU free"
    assert phrases[1] == "node(s) have less than 8192 MiB of memory free"
    assert phrases[3] == "node(s) have no GPU"
    assert phrases[4] == "node(s) have no GPU of model T4,V100"
    assert phrases[6] == "node(s) have no card of model T4,V100 with 300 milli of GPU compute free"
    assert phrases[7] == (
        "node(s) have no card of model T4,V100 with 300 milli of GPU compute and 10240 MiB of "
        "GPU memory free"
    )
    memory_only = PodRequest(500, 512, 1, 1, 4096)
    assert (
        refusal_phrases(memory_only)[7] == "node(s) have no card with 4096 MiB of GPU memory free"
    )
    whole = PodRequest(500, 512, 4, 1000)
    assert refusal_phrases(whole)[5] == "node(s) have fewer than 4 whole GPUs free"


def test_reason_counts_read_like_kube_schedulers_message() -> None:
    failed = {"a": "node(s) have no GPU", "b": "node(s) have no GPU"}
    failed |= {f"n{i}": "node(s) have fewer than 2 whole GPUs free" for i in range(12)}
    assert reason_counts(failed, {"c": "node(s) have no healthy GPU of model A100"}) == (
        "1 node(s) have no healthy GPU of model A100, "
        "12 node(s) have fewer than 2 whole GPUs free, 2 node(s) have no GPU"
    )


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
def test_structural_codes_say_what_the_node_by_node_reason_says_as_facts_change(
    seed: int,
) -> None:
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
        per_node = [
            structural(facts, i, name, request)
            for i, name in zip(never.tolist(), names, strict=True)
        ]
        assert all(per_node)
        codes = facts.structural_codes(never, request)
        labels = [STRUCTURAL_CATEGORIES[c] for c in codes.tolist()]
        assert labels == [reason_category(reason) for reason in per_node]
        # An unreadable inventory is told apart from a missing one.
        assert [c == 4 for c in codes.tolist()] == ["unreadable" in r for r in per_node]
        phrases = phrases_of(structural_phrases(request), codes)
        assert not any(name in phrase for name in engine.names for phrase in phrases)
        # A node's inventory, health or memory changes (or only its usage: same facts).
        changed = rng.choice(engine.names)
        infos[changed] = random_info(rng, changed) if rng.random() < 0.7 else infos[changed]
        facts.update(engine.row_of(changed), changed, infos[changed])


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
    codes = facts.structural_codes(rows, t4_share)
    assert STRUCTURAL_CATEGORIES[int(codes[0])] == "gpu-memory"
    assert phrases_of(structural_phrases(t4_share), codes) == [
        "node(s) have no card of model T4 with 16000 MiB of GPU memory in total"
    ]
    three_v100 = GpuRequest(RequestKind.WHOLE, 1000, 1024, whole_gpus=3, gpu_models=v100)
    assert phrases_of(structural_phrases(three_v100), facts.structural_codes(rows, three_v100)) == [
        "node(s) have fewer than 3 healthy GPUs of model V100"
    ]
