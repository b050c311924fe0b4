"""A trace as the scale replay uses it: nodes, pods in arrival order up to 100 % arrived, the Pod
manifests a user would write for them, and what ``kubegpu simulate`` gives for the same pods.

Node names carry the arrival fixture's rank as a zero-padded prefix (``0601-openb-node-0000``),
as the paper's simulator names them: the extender breaks ties between equal nodes by name, the
simulator by rank, and with these names the two orders are one.

openb's shares name compute (milli-GPU) only; a kubegpu share also asks card memory, so each
share asks ``SHARE_MEMORY_MIB``, far below any card's memory: compute decides, as in the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kubegpu.placement.model import MILLI_PER_GPU, GpuState, NodeState, PodRequest
from kubegpu.placement.policies import POLICIES
from kubegpu.simulate.arrivals import Arrivals, generate_arrivals, load_fixture
from kubegpu.simulate.replay import ranked_engine, replay, target_workload
from kubegpu.simulate.traces import TracePod, load_nodes, load_pods

SHARE_MEMORY_MIB = 1
SCHEDULER_NAME = "kubegpu-scheduler"
REPLAY_LABEL = "kubegpu.io/replay"
WHOLE_GPU = "nvidia.com/gpu"
SHARE_SLOT = "kubegpu.io/gpu-shared"
GPU_COMPUTE = "kubegpu.io/gpu-compute"
GPU_MEMORY = "kubegpu.io/gpu-memory"


@dataclass(frozen=True)
class ReplayTrace:
    """The cluster (``nodes``, named as KWOK nodes) and the pods that arrive until the GPU
    demand reaches 100 % of the cluster's GPUs (``pods``), with every pod of the original trace
    (``originals``: the target workload FGD and ours measure against)."""

    nodes: tuple[NodeState, ...]
    pods: tuple[PodRequest, ...]
    originals: tuple[TracePod, ...]

    @property
    def capacity_milli(self) -> int:
        return sum(len(n.gpus) for n in self.nodes) * MILLI_PER_GPU

    def arrived_milli(self) -> np.ndarray:
        return np.cumsum([p.gpu_count * p.gpu_milli for p in self.pods], dtype=np.int64)


def ranked_name(name: str, rank: int, width: int) -> str:
    return f"{rank:0{width}d}-{name}"


def up_to_full(pods: Sequence[PodRequest], capacity_milli: int) -> tuple[PodRequest, ...]:
    """The arrival order's pods until the next would take the arrived GPU demand past 100 %."""
    kept: list[PodRequest] = []
    arrived = 0
    for pod in pods:
        demand = pod.gpu_count * pod.gpu_milli
        if arrived + demand > capacity_milli:
            break
        arrived += demand
        kept.append(pod)
    return tuple(kept)


def from_arrivals(
    nodes: Sequence[NodeState], arrivals: Arrivals, originals: Sequence[TracePod]
) -> ReplayTrace:
    width = max(4, len(str(max(arrivals.node_ranks.values(), default=0))))
    named = tuple(
        replace(n, name=ranked_name(n.name, arrivals.node_ranks[n.name], width), rank=0)
        for n in nodes
    )
    capacity = sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU
    pods = tuple(
        replace(p, name=(p.name or f"pod-{i}").lower().replace("_", "-"))
        for i, p in enumerate(up_to_full(arrivals.pods, capacity))
    )
    return ReplayTrace(named, pods, tuple(originals))


def openb(trace_dir: Path, workload: str = "default", seed: int = 42) -> ReplayTrace:
    """An openb workload with the paper's arrival fixture for ``seed`` (what `kubegpu simulate`
    reads for the same trace and seed)."""
    nodes = load_nodes(trace_dir / "openb_node_list_gpu_node.csv")
    originals = load_pods(trace_dir / f"openb_pod_list_{workload}.csv")
    fixture = trace_dir / "arrivals" / f"openb_pod_list_{workload}_seed{seed}.txt.gz"
    return from_arrivals(nodes, load_fixture(fixture, originals, nodes), originals)


# The small cluster CI replays: our own node shapes and pod mix (not openb's), drawn from a
# seeded generator, with arrivals by `kubegpu trace arrivals`' method (generate_arrivals).
_SMALL_NODE_SHAPES = (  # (model, cards, cpu milli, memory MiB, weight)
    ("G2", 8, 96_000, 786_432, 0.35),
    ("T4", 2, 96_000, 393_216, 0.40),
    ("P100", 2, 64_000, 262_144, 0.12),
    ("V100M16", 4, 96_000, 524_288, 0.08),
    ("V100M32", 8, 96_000, 786_432, 0.05),
)


def small(nodes: int = 100, pods: int = 1_000, seed: int = 7) -> ReplayTrace:
    """A generated cluster of ``nodes`` and a trace of ``pods``: CPU-only pods, shares of one
    card (100…900 milli) and whole cards (1, 2, 4 or 8), with CPU and memory in the proportions
    of a GPU cluster; arrivals inflated so that 100 % arrives."""
    rng = np.random.default_rng(seed)
    weights = np.array([s[4] for s in _SMALL_NODE_SHAPES])
    shapes = rng.choice(len(_SMALL_NODE_SHAPES), size=nodes, p=weights / weights.sum())
    node_states = []
    for i, s in enumerate(shapes.tolist()):
        model, cards, cpu, memory, _ = _SMALL_NODE_SHAPES[s]
        gpus = tuple(GpuState(k, MILLI_PER_GPU) for k in range(cards))
        node_states.append(NodeState(f"small-node-{i:04d}", cpu, cpu, memory, model, gpus))
    originals = []
    for i in range(pods):
        kind = rng.choice(3, p=[0.15, 0.65, 0.20])
        cpu = int(rng.choice([1_000, 2_000, 4_000, 8_000, 12_000, 16_000]))
        memory = int(rng.choice([2_048, 4_096, 8_192, 16_384, 32_768]))
        if kind == 0:
            request = PodRequest(cpu, memory, 0, 0, name=f"small-pod-{i:04d}")
        elif kind == 1:
            milli = int(rng.integers(1, 10)) * 100
            request = PodRequest(cpu, memory, 1, milli, name=f"small-pod-{i:04d}")
        else:
            count = int(rng.choice([1, 1, 1, 1, 2, 4]))
            request = PodRequest(
                cpu * count, memory * count, count, MILLI_PER_GPU, name=f"small-pod-{i:04d}"
            )
        originals.append(TracePod(request.name or "", request, ""))
    arrivals = generate_arrivals(originals, node_states, seed, inflation=1.3)
    return from_arrivals(node_states, arrivals, originals)


def simulated(trace: ReplayTrace, policy: str, seed: int) -> np.ndarray:
    """GPU milli allocated after each pod of ``trace.pods`` by ``kubegpu simulate``'s replay with
    ``policy`` on the same nodes, in the same order, with the same tie-break."""
    spec = POLICIES[policy]
    result = replay(
        trace.nodes, _arrivals(trace), spec, target_workload(spec, trace.originals), seed
    )
    return result.used_milli


def simulated_nodes(trace: ReplayTrace, policy: str, seed: int) -> list[str]:
    """The node the simulator puts each pod on ("" where it refuses it), for comparing choices
    with the real scheduler's pod by pod."""
    spec = POLICIES[policy]
    engine = ranked_engine(
        trace.nodes, _arrivals(trace), spec, target_workload(spec, trace.originals), seed
    )
    return [(p.node if (p := engine.place(pod)) is not None else "") for pod in trace.pods]


def _arrivals(trace: ReplayTrace) -> Arrivals:
    ranks = {n.name: i for i, n in enumerate(sorted(trace.nodes, key=lambda n: n.name))}
    return Arrivals(trace.pods, ranks)


def workload_file(trace: ReplayTrace, policy: str) -> dict[str, Any]:
    """The extender's ``workload-file`` document: the target workload the simulator measures
    ``policy`` against (every pod of the original trace), so both score against one workload."""
    workload = target_workload(POLICIES[policy], trace.originals)
    return {
        "pods": [
            {
                "cpuMilli": p.cpu_milli,
                "gpuMilli": p.gpu_milli,
                "gpuCount": p.gpu_count,
                "models": sorted(p.gpu_models),
                "weight": p.weight,
            }
            for p in workload.pods
        ]
    }


def pod_manifest(
    pod: PodRequest, namespace: str, run: str, scheduler_name: str = SCHEDULER_NAME
) -> dict[str, Any]:
    """The Pod a user would apply for ``pod``: whole cards as ``nvidia.com/gpu``, a share as one
    slot with its compute and memory, CPU and memory requests; scheduled by kubegpu."""
    requests: dict[str, str] = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    limits: dict[str, str] = {}
    if pod.gpu_count and pod.gpu_milli >= MILLI_PER_GPU:
        limits[WHOLE_GPU] = str(pod.gpu_count)
    elif pod.gpu_count:
        limits[SHARE_SLOT] = "1"
        limits[GPU_COMPUTE] = str(pod.gpu_milli)
        limits[GPU_MEMORY] = str(SHARE_MEMORY_MIB)
    annotations = {}
    if pod.gpu_models:
        annotations["kubegpu.io/gpu-models"] = ",".join(sorted(pod.gpu_models))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": namespace,
            "labels": {REPLAY_LABEL: run},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": scheduler_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    # Never pulled: KWOK nodes run no containers.
                    "image": "registry.invalid/replay:1",
                    "resources": {"requests": {**requests, **limits}, "limits": limits},
                }
            ],
        },
    }


def gpu_milli(pod: PodRequest) -> int:
    return pod.gpu_count * pod.gpu_milli
