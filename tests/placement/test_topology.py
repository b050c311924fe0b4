"""Topology-aware preferred allocation against an independent brute force."""

from __future__ import annotations

import itertools
import random

import pytest

from kubegpu.core.gpu import GpuDevice, GpuLink, GpuUuid, NodeInventory, PcieLink
from kubegpu.inventory.spec import resolve_fake_spec
from kubegpu.placement.topology import (
    PreferenceError,
    ReplicaId,
    ReplicaPolicy,
    best_gpu_set,
    pair_score,
    pick_replicas,
)


def preset(name: str) -> NodeInventory:
    return resolve_fake_spec(name).inventory


def brute_force_score(inv: NodeInventory, uuids: tuple[GpuUuid, ...]) -> int:
    """Written apart from the module on purpose: NVLink lanes ×100 + PCIe level, +5 same NUMA."""
    total = 0
    for a, b in itertools.combinations(uuids, 2):
        ga, gb = inv.by_uuid(a), inv.by_uuid(b)
        link = inv.link(a, b)
        if link is not None:
            total += 100 * link.nvlinks + link.pcie.value
        if ga.numa_node is not None and ga.numa_node == gb.numa_node:
            total += 5
    return total


def brute_force_best(
    inv: NodeInventory, available: list[GpuUuid], must: list[GpuUuid], size: int
) -> tuple[int, tuple[GpuUuid, ...]]:
    order = {g.uuid: g.index for g in inv.gpus}
    best: tuple[int, tuple[int, ...]] | None = None
    pool = sorted(set(available) | set(must), key=lambda u: order[u])
    for combo in itertools.combinations(pool, size):
        if not set(must) <= set(combo):
            continue
        score = brute_force_score(inv, combo)
        key = tuple(sorted(order[u] for u in combo))
        # Highest score; ties to the lexicographically smallest index tuple.
        if best is None or score > best[0] or (score == best[0] and key < best[1]):
            best = (score, key)
    assert best is not None
    return best[0], tuple(inv.by_index(i).uuid for i in best[1])


def test_one_nvlink_lane_outweighs_any_pcie_path_on_the_same_numa_node() -> None:
    one_lane = pair_score(GpuLink(PcieLink.SYS, nvlinks=1), 0, 1)
    best_pcie = pair_score(GpuLink(max(PcieLink)), 0, 0)
    assert one_lane > best_pcie


CASES = [
    pytest.param(name, seed, id=f"{name}-seed{seed}")
    for name in ("8xA100-80GB-NVLink", "8xV100-32GB-HybridCubeMesh", "2xV100-2xT4", "4xT4")
    for seed in range(12)
]


@pytest.mark.parametrize(("name", "seed"), CASES)
def test_best_set_matches_brute_force_with_must_include(name: str, seed: int) -> None:
    inv = preset(name)
    rng = random.Random(seed)
    uuids = [g.uuid for g in inv.gpus]
    available = rng.sample(uuids, rng.randint(2, len(uuids)))
    size = rng.randint(1, len(available))
    must = rng.sample(available, rng.randint(0, min(2, size)))

    choice = best_gpu_set(inv, available, must, size)
    want_score, want_set = brute_force_best(inv, available, must, size)

    assert set(must) <= set(choice.uuids)
    assert set(choice.uuids) <= set(available)
    assert len(choice.uuids) == size
    assert brute_force_score(inv, choice.uuids) == want_score == choice.score
    assert choice.uuids == want_set  # the documented tie-break: lowest indices


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6])
def test_every_size_on_the_cube_mesh_is_optimal_from_all_gpus(size: int) -> None:
    inv = preset("8xV100-32GB-HybridCubeMesh")
    uuids = [g.uuid for g in inv.gpus]
    choice = best_gpu_set(inv, uuids, [], size)
    assert choice.score == brute_force_best(inv, uuids, [], size)[0]


def test_cube_mesh_prefers_nvlinked_partners_over_pcie_only_ones() -> None:
    inv = preset("8xV100-32GB-HybridCubeMesh")
    gpu0 = inv.by_index(0).uuid
    choice = best_gpu_set(inv, [g.uuid for g in inv.gpus], [gpu0], 2)
    partner = next(u for u in choice.uuids if u != gpu0)
    link = inv.link(gpu0, partner)
    assert link is not None
    others = [inv.link(gpu0, g.uuid) or GpuLink(PcieLink.SYS) for g in inv.gpus[1:]]
    best_lanes = max(link.nvlinks for link in others)
    assert link.nvlinks == best_lanes > 0


def test_sixteen_gpus_still_exact_against_brute_force() -> None:
    inv = preset("16xH100-80GB")
    uuids = [g.uuid for g in inv.gpus]
    rng = random.Random(7)
    must = rng.sample(uuids, 2)
    choice = best_gpu_set(inv, uuids, must, 5)
    assert choice.score == brute_force_best(inv, uuids, must, 5)[0]


def synthetic(n: int, seed: int) -> NodeInventory:
    """Random non-uniform links, so the bound is exercised beyond the regular presets."""
    rng = random.Random(seed)
    gpus = tuple(
        GpuDevice(i, GpuUuid(f"GPU-{i:02d}"), "X", 1, f"0000:{i:02x}:00.0", i, None, i % 2)
        for i in range(n)
    )
    links = {
        (a.uuid, b.uuid): GpuLink(rng.choice(list(PcieLink)), rng.choice([0, 0, 1, 2, 4]))
        for a, b in itertools.combinations(gpus, 2)
    }
    return NodeInventory(gpus, links)


@pytest.mark.parametrize("seed", range(6))
def test_random_topologies_match_brute_force(seed: int) -> None:
    inv = synthetic(10, seed)
    uuids = [g.uuid for g in inv.gpus]
    rng = random.Random(seed)
    size = rng.randint(2, 6)
    must = rng.sample(uuids, 1)
    assert best_gpu_set(inv, uuids, must, size).score == brute_force_best(inv, uuids, must, size)[0]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        pytest.param(["GPU-00", "GPU-zz"], [], 1, "unknown GPU GPU-zz", id="unknown-id"),
        pytest.param(["GPU-00", "GPU-01"], [], 3, "exceeds", id="too-many"),
        pytest.param(["GPU-00", "GPU-01"], ["GPU-00", "GPU-01"], 1, "smaller", id="size-lt-must"),
    ],
)
def test_impossible_requests_are_refused(
    available: list[str], must: list[str], size: int, message: str
) -> None:
    inv = synthetic(4, 0)
    with pytest.raises(PreferenceError, match=message):
        best_gpu_set(inv, [GpuUuid(a) for a in available], [GpuUuid(m) for m in must], size)


# --- replicas ---------------------------------------------------------------------------------


def replicas(gpus: int, per_gpu: int) -> list[ReplicaId]:
    return [
        ReplicaId(f"GPU-{g}::{k}", GpuUuid(f"GPU-{g}"), k)
        for g in range(gpus)
        for k in range(per_gpu)
    ]


def gpus_of(ids: tuple[str, ...]) -> list[str]:
    return [i.split("::")[0] for i in ids]


def test_distributed_spreads_one_request_over_distinct_gpus() -> None:
    reps = replicas(4, 4)
    chosen = pick_replicas(reps, [r.device_id for r in reps], [], 3, ReplicaPolicy.DISTRIBUTED)
    assert len(set(gpus_of(chosen))) == 3


def test_distributed_prefers_the_least_used_gpu() -> None:
    reps = replicas(3, 4)
    # GPU-0 has 3 of 4 replicas in use, GPU-1 one, GPU-2 two.
    taken = {"GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0", "GPU-2::0", "GPU-2::1"}
    free = [r.device_id for r in reps if r.device_id not in taken]
    chosen = pick_replicas(reps, free, [], 1, ReplicaPolicy.DISTRIBUTED)
    assert gpus_of(chosen) == ["GPU-1"]


def test_packed_fills_the_busiest_gpu_first() -> None:
    reps = replicas(3, 4)
    taken = {"GPU-1::0", "GPU-1::1"}
    free = [r.device_id for r in reps if r.device_id not in taken]
    chosen = pick_replicas(reps, free, [], 2, ReplicaPolicy.PACKED)
    assert gpus_of(chosen) == ["GPU-1", "GPU-1"]


def test_packed_keeps_a_fresh_request_on_one_gpu() -> None:
    reps = replicas(4, 4)
    chosen = pick_replicas(reps, [r.device_id for r in reps], [], 3, ReplicaPolicy.PACKED)
    assert len(set(gpus_of(chosen))) == 1


@pytest.mark.parametrize("policy", list(ReplicaPolicy), ids=lambda p: p.value)
def test_replica_must_include_ids_come_first_and_are_kept(policy: ReplicaPolicy) -> None:
    reps = replicas(2, 3)
    all_ids = [r.device_id for r in reps]
    chosen = pick_replicas(reps, all_ids, ["GPU-1::2"], 3, policy)
    assert chosen[0] == "GPU-1::2"
    assert len(set(chosen)) == 3
    assert set(chosen) <= set(all_ids)


def test_replica_request_larger_than_free_ids_is_refused() -> None:
    reps = replicas(1, 2)
    with pytest.raises(PreferenceError, match="exceeds"):
        pick_replicas(reps, ["GPU-0::0"], [], 2, ReplicaPolicy.PACKED)
