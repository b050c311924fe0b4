"""Card-level accounting and how each pod is read: decisions, pending binds, pods placed by
someone else, malformed annotations."""

from __future__ import annotations

from typing import Any

from kubegpu.placement.model import GpuState
from kubegpu.sharing.accounting import NodeInfo, PodUsage, card_usage, node_state, over_capacity
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    AllocationDecision,
    CardShare,
    GpuRecord,
    NodeGpuInventory,
    encode_allocation,
)
from kubegpu.sharing.podstate import read_pod
from kubegpu.sharing.resources import ResourceNames

INV = NodeGpuInventory(
    (
        GpuRecord("g0", 0, "A100", 40960),
        GpuRecord("g1", 1, "A100", 40960),
        GpuRecord("g2", 2, "A100", 40960, healthy=False),
        GpuRecord("g3", 3, "A100", 40960),
    )
)


def usage(uid: str, *cards: CardShare, undecided: int = 0) -> PodUsage:
    return PodUsage(uid, f"ns/{uid}", "n", 1000, 1024, cards, undecided_whole_gpus=undecided)


def test_node_state_subtracts_shares_and_offers_nothing_on_unhealthy_cards() -> None:
    info = NodeInfo("n", 8000, 65536, INV)
    state = node_state(
        info,
        [usage("a", CardShare("g0", 0, 300, 10240)), usage("b", CardShare("g0", 0, 200, 4096))],
    )
    assert (state.cpu_free_milli, state.memory_free_mib) == (6000, 63488)
    assert state.gpus == (
        GpuState(0, 500, 26624, "A100", 40960),
        GpuState(1, 1000, 40960, "A100", 40960),
        GpuState(2, 0, 0, "A100", 40960),
        GpuState(3, 1000, 40960, "A100", 40960),
    )
    assert state.gpu_model == "A100"


def test_node_state_keeps_each_cards_model_on_a_node_mixing_models() -> None:
    mixed = NodeGpuInventory(
        (
            GpuRecord("v0", 0, "Tesla V100-SXM2-16GB", 16384),
            GpuRecord("v1", 1, "Tesla V100-SXM2-16GB", 16384),
            GpuRecord("t2", 2, "Tesla T4", 15360),
            GpuRecord("t3", 3, "Tesla T4", 15360, healthy=False),
        )
    )
    state = node_state(
        NodeInfo("n", 8000, 65536, mixed), [usage("a", CardShare("t2", 2, 250, 4096))]
    )
    assert state.gpu_model == ""
    # In the label spelling, the one the pods' model lists are parsed into.
    assert state.card_models == ("Tesla-V100-SXM2-16GB",) * 2 + ("Tesla-T4",) * 2
    assert state.gpus[2] == GpuState(2, 750, 11264, "Tesla-T4", 15360)
    assert state.gpus[3] == GpuState(3, 0, 0, "Tesla-T4", 15360)


def test_pods_without_a_decision_take_the_highest_free_cards() -> None:
    held = card_usage(INV, [usage("w", undecided=1), usage("a", CardShare("g3", 3, 100, 1))])
    # g3 is partly used and g2 unhealthy-but-free; the assumption takes the highest fully free.
    assert held["g2"] == (1000, 40960)
    assert held["g3"] == (100, 1)


def test_over_capacity_lists_each_overfull_card() -> None:
    pods = [usage("a", CardShare("g1", 1, 700, 30000)), usage("b", CardShare("g1", 1, 400, 20000))]
    assert over_capacity(INV, pods) == [
        "card g1 (index 1): 1100 milli held, 1000 exist",
        "card g1 (index 1): 50000 MiB held, 40960 exist",
    ]
    assert over_capacity(INV, pods[:1]) == []


def pod(
    node: str | None,
    annotation: str | None,
    phase: str = "Pending",
    limits: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "5",
            "annotations": {} if annotation is None else {ALLOCATION_ANNOTATION: annotation},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "resources": {
                        "requests": {"cpu": "1"},
                        "limits": limits or {"nvidia.com/gpu": "1"},
                    },
                }
            ],
        },
        "status": {"phase": phase},
    }


DECIDED = encode_allocation(
    AllocationDecision("n", (CardShare("g1", 1, 1000, 40960),), (), "t", "kubegpu", False)
)


def test_bound_pod_with_decision_holds_its_cards() -> None:
    reading = read_pod(pod("n", DECIDED), ResourceNames())
    assert reading.usage is not None and reading.problem == ""
    assert reading.usage.cards == (CardShare("g1", 1, 1000, 40960),) and reading.usage.bound


def test_decided_but_unbound_pod_holds_its_cards_pending() -> None:
    reading = read_pod(pod(None, DECIDED), ResourceNames())
    assert reading.usage is not None and not reading.usage.bound
    assert reading.usage.node == "n"


def test_terminated_pods_hold_nothing() -> None:
    assert read_pod(pod("n", DECIDED, phase="Succeeded"), ResourceNames()).usage is None


def test_malformed_decision_is_reported_and_treated_as_none() -> None:
    reading = read_pod(pod("n", '{"v":1,"node":3}'), ResourceNames())
    assert reading.decision is None
    assert "annotation kubegpu.io/gpu-allocation: node must be str" in reading.problem
    assert reading.usage is not None and reading.usage.undecided_whole_gpus == 1


def test_decision_for_another_node_is_not_trusted() -> None:
    reading = read_pod(pod("other", DECIDED), ResourceNames())
    assert "names node n but the pod is bound to other" in reading.problem
    assert reading.usage is not None and reading.usage.cards == ()


def test_a_node_over_its_cpu_or_memory_has_none_free_never_a_negative_amount() -> None:
    # Pods placed by another scheduler, or allocatable shrunk under running pods: the node
    # holds more than it has. Free is 0, as for an over-full card, not a debt.
    info = NodeInfo("n", 2000, 2048, INV)
    state = node_state(info, [usage("a"), usage("b"), usage("c")])  # 3000 milli, 3072 MiB
    assert state.cpu_free_milli == 0
    assert state.memory_free_mib == 0
    assert state.cpu_capacity_milli == 2000
