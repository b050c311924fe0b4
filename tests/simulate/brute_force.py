"""Exact optima of tiny placement problems by exhaustive search, and random tiny instances.

The search tries every pod on every node and every distinct card (or refused), with the
simulator's rules: CPU, memory, the pod's models, whole free cards for whole-card pods, a
share on one card with enough free milli. Pruned only by "the pods left cannot beat the best
so far", so it is exact; kept to a handful of pods and cards.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kubegpu.placement.model import GpuState, NodeState, PodRequest


def optimum(nodes: Sequence[NodeState], pods: Sequence[PodRequest]) -> int:
    """The most GPU milli any placement of ``pods`` (any subset) on the empty ``nodes`` holds."""
    cpu = [n.cpu_free_milli for n in nodes]
    memory = [n.memory_free_mib for n in nodes]
    cards = [[g.free_milli for g in n.gpus] for n in nodes]
    left = [0] * (len(pods) + 1)
    for i in range(len(pods) - 1, -1, -1):
        left[i] = left[i + 1] + pods[i].total_gpu_milli
    best = 0

    def search(i: int, held: int) -> None:
        nonlocal best
        if held + left[i] <= best:
            return
        if i == len(pods):
            best = held
            return
        pod = pods[i]
        for n, node in enumerate(nodes):
            if not pod.gpu_count or not pod.allows_model(node.gpu_model):
                continue
            if cpu[n] < pod.cpu_milli or memory[n] < pod.memory_mib:
                continue
            cpu[n] -= pod.cpu_milli
            memory[n] -= pod.memory_mib
            free = cards[n]
            if pod.gpu_milli == 1000:
                full = [j for j, f in enumerate(free) if f == 1000][: pod.gpu_count]
                if len(full) == pod.gpu_count:
                    for j in full:
                        free[j] = 0
                    search(i + 1, held + pod.total_gpu_milli)
                    for j in full:
                        free[j] = 1000
            else:  # one card per distinct free amount: the others are the same choice
                for j in sorted({f: j for j, f in enumerate(free)}.values()):
                    if free[j] >= pod.gpu_milli:
                        free[j] -= pod.gpu_milli
                        search(i + 1, held + pod.total_gpu_milli)
                        free[j] += pod.gpu_milli
            cpu[n] += pod.cpu_milli
            memory[n] += pod.memory_mib
        search(i + 1, held)

    search(0, 0)
    return best


def instance(rng: random.Random) -> tuple[list[NodeState], list[PodRequest]]:
    """1–3 nodes of 1, 2 or 4 cards of model A or B; 3–8 pods: shares, whole-card pods of
    one or two cards, CPU-only pods; a fifth limited to one model."""
    nodes = []
    for j in range(rng.randint(1, 3)):
        cpu = rng.choice([8000, 16000, 32000])
        cards = tuple(GpuState(c) for c in range(rng.choice([1, 2, 4])))
        nodes.append(NodeState(f"n{j}", cpu, cpu, 65536, rng.choice("AB"), cards))
    pods = []
    for i in range(rng.randint(3, 8)):
        kind = rng.random()
        models = frozenset(rng.choice("AB")) if rng.random() < 0.2 else frozenset[str]()
        if kind < 0.6:
            cpu, memory = rng.choice([1000, 2000, 4000, 6000]), rng.choice([1024, 8192])
            milli = rng.choice([100, 250, 300, 400, 500, 600, 750, 810])
            pods.append(PodRequest(cpu, memory, 1, milli, gpu_models=models, name=f"p{i}"))
        elif kind < 0.85:
            cpu, count = rng.choice([2000, 4000, 8000]), rng.choice([1, 2])
            pods.append(PodRequest(cpu, 4096, count, 1000, gpu_models=models, name=f"p{i}"))
        else:
            pods.append(PodRequest(rng.choice([2000, 8000]), 4096, name=f"p{i}"))
    return nodes, pods
