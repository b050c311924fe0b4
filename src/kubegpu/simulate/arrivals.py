"""The arrival sequence of a trace replay and the nodes' tie-break ranks.

The paper's simulator shuffles the pods, then samples clones (or drops pods) until the GPU
demand is ``inflation`` × cluster capacity, and ranks nodes by a seeded permutation (spec §2.2).
Its exact sequences come from Go's ``math/rand`` and are provided as fixtures; for other
traces :func:`generate_arrivals` follows the same method with numpy's seeded generator.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kubegpu.placement.model import MILLI_PER_GPU, NodeState, PodRequest
from kubegpu.placement.target import node_card_memories, reference_card_memory
from kubegpu.simulate.traces import TraceError, TracePod


@dataclass(frozen=True)
class Arrivals:
    """Pods in arrival order (clones included) and each node's tie-break rank."""

    pods: tuple[PodRequest, ...]
    node_ranks: dict[str, int]


def load_fixture(path: Path, pods: Sequence[TracePod], nodes: Sequence[NodeState]) -> Arrivals:
    """Read ``P,<pod>`` / ``N,<rank>-<node>`` lines written from the paper simulator's log."""
    by_name = {p.name: p.request for p in pods}
    node_names = {n.name for n in nodes}
    order: list[PodRequest] = []
    ranks: dict[str, int] = {}
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise TraceError(path, 0, "", f"cannot read arrivals: {exc}") from None
    for number, line in enumerate(lines, start=1):
        kind, _, value = line.partition(",")
        if kind == "P":
            original = value.split("-tuned-")[0]
            request = by_name.get(original)
            if request is None:
                raise TraceError(path, number, "", f"pod {original!r} is not in the pod list")
            order.append(request if original == value else _renamed(request, value))
        elif kind == "N":
            rank, _, name = value.partition("-")
            if name not in node_names or not rank.isdigit():
                raise TraceError(path, number, "", f"bad node line {line!r}")
            ranks[name] = int(rank)
        elif line.strip():
            raise TraceError(path, number, "", f"unknown line {line!r}")
    if set(ranks) != node_names:
        raise TraceError(path, len(lines), "", "node ranks do not cover the node list")
    return Arrivals(tuple(order), ranks)


def _renamed(request: PodRequest, name: str) -> PodRequest:
    return PodRequest(
        request.cpu_milli,
        request.memory_mib,
        request.gpu_count,
        request.gpu_milli,
        request.gpu_memory_mib,
        request.gpu_models,
        name,
    )


def generate_arrivals(
    pods: Sequence[TracePod], nodes: Sequence[NodeState], seed: int, inflation: float
) -> Arrivals:
    """The paper's method with our own seeded RNG: shuffle, tune to ``inflation`` × capacity."""
    rng = np.random.default_rng(seed)
    originals = sorted(pods, key=lambda p: p.name)
    order = [originals[i].request for i in rng.permutation(len(originals))]
    capacity = sum(len(n.gpus) for n in nodes) * MILLI_PER_GPU
    target = inflation * capacity
    # Shares count at their level on the most common card (memory-only variants; else compute).
    card_memory = reference_card_memory(node_card_memories(nodes))
    demand = sum(p.gpu_count * p.card_milli(card_memory) for p in order)
    if demand < target:
        clone = 0
        while True:
            candidate = originals[int(rng.integers(len(originals)))].request
            per_card = candidate.card_milli(card_memory)
            # As in the paper: the stop test uses the per-card share, not the total.
            if demand + per_card > target:
                break
            order.append(_renamed(candidate, f"{candidate.name}-tuned-{clone}"))
            demand += candidate.gpu_count * per_card
            clone += 1
    else:
        while demand > target:
            removed = order.pop(int(rng.integers(len(order))))
            demand -= removed.gpu_count * removed.card_milli(card_memory)
    ranks = rng.permutation(len(nodes))
    by_name = sorted(n.name for n in nodes)
    return Arrivals(tuple(order), {name: int(r) for name, r in zip(by_name, ranks, strict=True)})


def write_fixture(path: Path, arrivals: Arrivals) -> None:
    """Write ``arrivals`` in the fixture format :func:`load_fixture` reads (gzip text)."""
    width = max(4, len(str(max(arrivals.node_ranks.values(), default=0))))
    lines = [f"P,{pod.name}" for pod in arrivals.pods]
    lines += [
        f"N,{rank:0{width}d}-{name}"
        for name, rank in sorted(arrivals.node_ranks.items(), key=lambda kv: kv[1])
    ]
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
