"""The demo's pure parts: node layout, scenario and trace pods, manifests, the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubegpu.demo.scenario import (
    DemoPod,
    builtin_pods,
    node_gpu_spec,
    node_layout,
    pod_manifest,
    take,
    trace_pods,
)
from kubegpu.demo.summary import (
    describe_request,
    pod_reason,
    reason_template,
    render_summary,
    summarize,
)
from kubegpu.inventory.spec import parse_fake_spec
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
from kubegpu.sharing.resources import RequestKind, gpu_request


def test_nodes_cycle_the_presets_and_never_share_a_card_uuid() -> None:
    nodes = node_layout(4)
    assert [n.preset for n in nodes] == [
        "8xA100-80GB-NVLink",
        "4xT4",
        "2xV100-2xT4",
        "8xA100-80GB-NVLink",
    ]
    uuids = [
        str(g.uuid)
        for n in nodes
        for g in parse_fake_spec(node_gpu_spec(n), name=n.name, source="test").inventory.gpus
    ]
    assert len(uuids) == 8 + 4 + 4 + 8 == len(set(uuids))
    assert node_gpu_spec(nodes[0]) == node_gpu_spec(node_layout(1)[0])  # stable across runs


def test_every_builtin_pod_is_a_request_the_extender_accepts() -> None:
    pods = builtin_pods()
    assert len({p.name for p in pods}) == len(pods)
    kinds = set()
    for pod in pods:
        request = gpu_request(pod_manifest(pod, scheduler_name="kubegpu-scheduler"))
        kinds.add(request.kind)
        if pod.shared:
            assert (request.compute_milli, request.gpu_memory_mib) == (
                pod.gpu_milli,
                pod.gpu_memory_mib,
            )
        elif pod.gpus:
            assert request.whole_gpus == pod.gpus
    assert kinds == {RequestKind.WHOLE, RequestKind.SHARED, RequestKind.NONE}


def test_more_pods_than_the_scenario_repeat_it_under_new_names() -> None:
    pods = [DemoPod("a", 1, 1), DemoPod("b", 1, 1)]
    assert [p.name for p in take(pods, 5)] == ["a", "b", "a-r1", "b-r1", "a-r2"]
    assert [p.name for p in take(pods, 1)] == ["a"]


def test_an_openb_slice_becomes_whole_shared_and_cpu_pods(tmp_path: Path) -> None:
    csv = tmp_path / "pods.csv"
    csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "openb-pod-0001,8000,16384,2,1000,\n"
        "openb-pod-0002,4000,8192,1,500,V100M16\n"
        "openb-pod-0003,2000,4096,0,0,\n"
    )
    whole, shared, cpu = trace_pods(csv, 3, seed=0)
    assert (whole.gpus, whole.cpu_milli) == (2, 8000)
    # Half of a 16 GiB card, rounded up to 256 MiB; the trace's model names are dropped.
    assert (shared.gpu_milli, shared.gpu_memory_mib, shared.models) == (500, 8192, "")
    assert (cpu.gpus, cpu.gpu_milli) == (0, 0)


def _node(name: str, cards: int, memory_mib: int) -> dict[str, Any]:
    inventory = NodeGpuInventory(
        tuple(GpuRecord(f"GPU-{name}-{i}", i, "T4", memory_mib) for i in range(cards))
    )
    return {
        "metadata": {
            "name": name,
            "annotations": {INVENTORY_ANNOTATION: encode_inventory(inventory)},
        }
    }


def _pod(
    name: str, node: str, card: int, compute: int, memory: int, shared: bool
) -> dict[str, Any]:
    share = CardShare(f"GPU-{node}-{card}", card, compute, memory)
    decision = AllocationDecision(
        node, (share,), (ContainerAllocation("main", False, (share,)),), "t", "test", shared
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {ALLOCATION_ANNOTATION: encode_allocation(decision)},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def test_summary_counts_cards_and_packing_and_flags_an_over_committed_card() -> None:
    nodes = [_node("n", 2, 16000)]
    refused = {
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "message": "0/1 ..."}],
        },
    }
    fine = summarize(
        nodes,
        [_pod("a", "n", 0, 600, 8000, True), _pod("b", "n", 0, 400, 8000, True), refused],
        {"default/r": {"n": "n: largest free card has 0 MiB, pod needs 100 MiB"}},
    )
    assert (fine.cards_total, fine.cards_used, fine.cards_shared, fine.cards_whole) == (2, 1, 1, 0)
    assert fine.memory_packed_pct == 50.0
    assert (fine.pods_running, fine.pods_refused) == (2, 1)
    assert fine.over_committed == ()
    assert fine.top_reasons[0].reason == "largest free card has N MiB, pod needs N MiB"
    lines = render_summary(fine)
    assert any("none (every card" in line for line in lines)
    # The refused pod is named with its reason, after the grouped reasons.
    (refused_pod,) = fine.refused
    assert refused_pod.pod == "default/r"
    assert refused_pod.reason == "n: largest free card has 0 MiB, pod needs 100 MiB"
    assert "  default/r (no GPU): n: largest free card has 0 MiB, pod needs 100 MiB" in lines
    assert lines.index("refused pods (why, per node):") > lines.index(
        "top refusal reasons (pod x node):"
    )
    # Without the scheduler's per-node reasons, the pod's PodScheduled message stands in.
    (alone,) = summarize(nodes, [refused]).refused
    assert alone.reason == "0/1 ..."

    over = summarize(
        nodes, [_pod("a", "n", 1, 600, 8000, True), _pod("b", "n", 1, 600, 8000, True)]
    )
    assert len(over.over_committed) == 1 and "card 1: 1200 milli" in over.over_committed[0]
    collide = summarize(
        nodes, [_pod("w", "n", 0, 1000, 16000, False), _pod("s", "n", 0, 0, 0, True)]
    )
    assert len(collide.over_committed) == 1  # a whole card shared with anyone


def test_reason_templates_drop_the_node_and_the_numbers() -> None:
    assert reason_template("gpu-node-1: needs 2 whole GPUs, 1 free") == "needs N whole GPUs, N free"
    assert reason_template("Insufficient cpu") == "Insufficient cpu"
    assert (
        reason_template("n: GPU models NVIDIA A100-SXM4-80GB, pod allows Tesla T4")
        == "GPU models NVIDIA A100-SXM4-80GB, pod allows Tesla T4"
    )


def test_a_pod_s_reason_groups_the_nodes_that_gave_the_same_one() -> None:
    by_node = {
        "gpu-node-2": "gpu-node-2: largest free card has 1024 MiB, pod needs 8192 MiB",
        "gpu-node-0": "Insufficient nvidia.com/gpu",
        "gpu-node-1": "Insufficient nvidia.com/gpu",
        "gpu-node-3": "gpu-node-3: largest free card has 2048 MiB, pod needs 8192 MiB",
    }
    assert pod_reason(by_node) == (
        "gpu-node-0, gpu-node-1: Insufficient nvidia.com/gpu; "
        "gpu-node-2: largest free card has 1024 MiB, pod needs 8192 MiB; "
        "gpu-node-3: largest free card has 2048 MiB, pod needs 8192 MiB"
    )
    # Only the node's own name is taken off the front.
    assert pod_reason({"a": "b: x"}) == "a: b: x"
    assert pod_reason({"-": "extender unreachable"}) == "extender unreachable"


def test_a_refused_pod_s_request_is_described_as_the_extender_reads_it() -> None:
    whole = pod_manifest(DemoPod("w", 1, 1, gpus=2), scheduler_name="s")
    shared = pod_manifest(
        DemoPod("s", 1, 1, gpu_milli=300, gpu_memory_mib=8192), scheduler_name="s"
    )
    cpu = pod_manifest(DemoPod("c", 1, 1), scheduler_name="s")
    assert describe_request(whole) == "2 whole GPUs"
    assert describe_request(shared) == "8192 MiB + 300 milli of one GPU"
    assert describe_request(cpu) == "no GPU"
