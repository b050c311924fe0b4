"""A mixed cluster as Kubernetes JSON, for the model, CLI and watch tests.

* ``a100``: 8x A100 80GB; shares on cards 0 (two pods) and 1; a whole-GPU pod with a decision
  (cards 2, 3); a plain ``nvidia.com/gpu`` pod without one; a decided pod not yet bound
  (card 4); a decision naming a card the node does not have.
* ``mixed``: 2x V100 16GB + 2x T4 15GB; a whole V100, a T4 share, and card 3 over-committed.
* ``sick``: 2x A10, card 1 unhealthy and still holding a pod.
* ``legacy``: no inventory annotation, 4 ``nvidia.com/gpu`` advertised, one plain GPU pod.
* ``cpu``: no GPUs, one CPU pod.
Plus one GPU pod waiting for the scheduler and one finished pod (holds nothing).
"""

from __future__ import annotations

from typing import Any

from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    AllocationDecision,
    CardShare,
    ContainerAllocation,
    GpuRecord,
    NodeGpuInventory,
    encode_allocation,
    encode_inventory,
)
from kubegpu.testing.apiserver import make_node, make_pod

A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"
T4 = "Tesla T4"
A10 = "NVIDIA A10"
A100_MIB = 81920
V100_MIB = 16384
T4_MIB = 15360
A10_MIB = 24576


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index:04d}"


def gpu_node(
    name: str,
    cards: list[tuple[str, int]],
    *,
    unhealthy: frozenset[int] = frozenset(),
    address: str = "",
) -> dict[str, Any]:
    inventory = NodeGpuInventory(
        tuple(
            GpuRecord(uuid(name, i), i, model, memory, i not in unhealthy)
            for i, (model, memory) in enumerate(cards)
        )
    )
    node = make_node(
        name,
        extended={"nvidia.com/gpu": str(len(cards)), "kubegpu.io/gpu-shared": str(4 * len(cards))},
        annotations={INVENTORY_ANNOTATION: encode_inventory(inventory)},
    )
    if address:
        node["status"]["addresses"].insert(0, {"type": "InternalIP", "address": address})
    return node


def running(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "main", "ready": True, "state": {"running": {}}}],
    }
    return pod


def shared_pod(
    name: str,
    namespace: str,
    node: str,
    index: int,
    memory_mib: int,
    milli: int,
    *,
    bound: bool = True,
) -> dict[str, Any]:
    card = CardShare(uuid(node, index), index, milli, memory_mib)
    decision = AllocationDecision(
        node=node,
        cards=(card,),
        containers=(ContainerAllocation("main", False, (card,)),),
        decided_at="2026-11-22T00:00:00Z",
        policy="binpack",
        shared=True,
    )
    pod = make_pod(
        name,
        namespace,
        limits={
            "kubegpu.io/gpu-memory": str(memory_mib),
            "kubegpu.io/gpu-compute": str(milli),
            "kubegpu.io/gpu-shared": "1",
        },
        node_name=node if bound else None,
        annotations={ALLOCATION_ANNOTATION: encode_allocation(decision)},
    )
    return running(pod) if bound else pod


def whole_pod(
    name: str,
    namespace: str,
    node: str | None,
    cards: list[tuple[str, int, int]] | None,
    count: int,
) -> dict[str, Any]:
    """``cards`` (uuid, index, memory) gives it a decision; ``None`` leaves it without one."""
    annotations = {}
    if cards is not None and node is not None:
        shares = tuple(CardShare(u, i, 1000, m) for u, i, m in cards)
        decision = AllocationDecision(
            node=node,
            cards=shares,
            containers=(ContainerAllocation("main", False, shares),),
            decided_at="2026-11-22T00:00:00Z",
            policy="binpack",
            shared=False,
        )
        annotations[ALLOCATION_ANNOTATION] = encode_allocation(decision)
    pod = make_pod(
        name,
        namespace,
        limits={"nvidia.com/gpu": str(count)},
        node_name=node,
        annotations=annotations,
    )
    return running(pod) if node else pod


def nodes() -> list[dict[str, Any]]:
    return [
        gpu_node("a100", [(A100, A100_MIB)] * 8, address="10.0.0.1"),
        gpu_node("mixed", [(V100, V100_MIB)] * 2 + [(T4, T4_MIB)] * 2, address="10.0.0.2"),
        gpu_node("sick", [(A10, A10_MIB)] * 2, unhealthy=frozenset({1})),
        make_node("legacy", extended={"nvidia.com/gpu": "4"}),
        make_node("cpu"),
    ]


def pods() -> list[dict[str, Any]]:
    """Every pod, each with a uid as the API server would give it."""
    listed = _pods()
    for pod in listed:
        meta = pod["metadata"]
        meta["uid"] = f"uid-{meta['namespace']}-{meta['name']}"
    return listed


def _pods() -> list[dict[str, Any]]:
    finished = whole_pod("done", "ml", "a100", [(uuid("a100", 5), 5, A100_MIB)], 1)
    finished["status"] = {"phase": "Succeeded"}
    ghost_card = CardShare("GPU-not-on-this-node", 9, 100, 1024)
    ghost = make_pod(
        "ghost",
        "web",
        limits={
            "kubegpu.io/gpu-memory": "1024",
            "kubegpu.io/gpu-compute": "100",
            "kubegpu.io/gpu-shared": "1",
        },
        node_name="a100",
        annotations={
            ALLOCATION_ANNOTATION: encode_allocation(
                AllocationDecision(
                    "a100",
                    (ghost_card,),
                    (ContainerAllocation("main", False, (ghost_card,)),),
                    "2026-11-22T00:00:00Z",
                    "binpack",
                    True,
                )
            )
        },
    )
    return [
        shared_pod("train-a", "ml", "a100", 0, 20480, 300),
        shared_pod("train-b", "ml", "a100", 0, 30720, 500),
        shared_pod("infer-c", "web", "a100", 1, 10240, 250),
        whole_pod(
            "whole-e",
            "ml",
            "a100",
            [(uuid("a100", 2), 2, A100_MIB), (uuid("a100", 3), 3, A100_MIB)],
            2,
        ),
        whole_pod("whole-d", "ml", "a100", None, 1),
        shared_pod("binding", "ml", "a100", 4, 8192, 100, bound=False),
        running(ghost),
        finished,
        whole_pod("v100-whole", "ml", "mixed", [(uuid("mixed", 0), 0, V100_MIB)], 1),
        shared_pod("t4-share", "web", "mixed", 2, 4096, 500),
        shared_pod("t4-big1", "web", "mixed", 3, 10240, 400),
        shared_pod("t4-big2", "ml", "mixed", 3, 6144, 400),
        shared_pod("stuck", "ml", "sick", 1, 2048, 200),
        whole_pod("legacy-job", "ml", "legacy", None, 1),
        whole_pod("queued", "ml", None, None, 1),
        running(make_pod("web-1", "default", requests={"cpu": "1"}, node_name="cpu")),
    ]
