"""openb with memory-only shares: does each policy rank a share by the memory it holds?

The memory-only variants of a trace (kubegpu.simulate.memory_only: every GPU share asks for
card memory alone, as gpushare's and Volcano's pods do) are replayed on the openb GPU nodes,
cards given their models' memory, three ways per policy:

* **levels**: the engine as shipped, a share weighed by its level (the larger of its compute
  and memory fractions of the card, kubegpu.placement.model.share_milli);
* **blind**: the same engine told no card's whole memory (free memory is still checked, so
  placements stay sound), i.e. shares weighed by their 1 milli of compute, as before levels;
* **peer first-fit**: Alibaba's gpushare extender at its best for packing: the first node
  in name order that fits, then the card with the least free memory that fits (its
  ``allocateGPUID``).

    .venv/bin/python bench/memory_only_replay.py --traces ../shared/traces/openb \\
        [--workloads default,gpushare100] [--variants openb,gpushare] [--seeds 42-44] \\
        [--policies bestfit,fgd,kubegpu] [--jobs 2]

A last row, ``dense``, is issue 32's dense packing in process (:func:`dense`): 2,000 pods
of 1-40 GiB onto 50 nodes of eight 80 GB cards, where GPU memory alone is scarce; its
allocation is the memory held at the end.

Prints one Markdown row per workload and variant: the mean over the seeds of the GPU
allocation at 100 % arrived (shares counted at their level on the cluster's most common card,
as `kubegpu simulate --memory-only` counts them), of the GPU pods placed out of those arrived,
and of the arrival index of the first refused GPU pod. Arrivals are the paper's method with
our seeded generator at 1.3 × capacity; nothing here is tuned.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import click
import numpy as np

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.feasibility import fitting_cards
from kubegpu.placement.fragmentation import class_key
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.policies import get_policy
from kubegpu.placement.policies.cards import first_by_keys
from kubegpu.placement.target import node_card_memories, reference_card_memory
from kubegpu.placement.target import target_workload as target
from kubegpu.simulate.arrivals import Arrivals, generate_arrivals
from kubegpu.simulate.command import parse_seeds
from kubegpu.simulate.memory_only import memory_only, with_card_memory
from kubegpu.simulate.replay import ReplayResult, discretise, ranked_engine, target_workload
from kubegpu.simulate.traces import TracePod, load_nodes, load_pods

PEER = "peer first-fit"


@dataclass(frozen=True)
class Outcome:
    workload: str
    variant: str
    seed: int
    way: str  # "levels", "blind" or PEER
    policy: str
    allocation_pct: float  # at 100 % arrived
    gpu_pods: int
    placed: int
    first_refused: int | None  # arrival index of the first GPU pod refused


def blind(nodes: list[NodeState]) -> list[NodeState]:
    """``nodes`` with no card's whole memory known: free memory still checked, levels off."""
    return [replace(n, gpus=tuple(replace(g, memory_mib=None) for g in n.gpus)) for n in nodes]


def peer_place(engine: PlacementEngine, by_name: list[int], pod: PodRequest) -> bool:
    """gpushare's choice: the first node by name that fits, its tightest card by memory."""
    rows = engine.feasible_rows(pod)
    if rows.size == 0:
        return False
    fits = np.zeros(len(engine.names), dtype=bool)
    fits[rows] = True
    i = next(r for r in by_name if fits[r])
    if pod.gpu_count == 0:
        engine.allocate_row(i, pod, ())
        return True
    if not pod.is_gpu_share:
        engine.allocate_row(i, pod, engine.pick_columns(i, pod))
        return True
    eligible = fitting_cards(engine, np.array([i]), pod)[0]
    engine.allocate_row(i, pod, (first_by_keys((engine.card_memory[i],), eligible),))
    return True


def run(traces: Path, workload: str, variant: str, seed: int, way: str, policy: str) -> Outcome:
    nodes = with_card_memory(load_nodes(traces / "openb_node_list_gpu_node.csv"))
    originals = load_pods(traces / f"openb_pod_list_{workload}.csv")
    requests = memory_only([p.request for p in originals], nodes, variant, seed)
    pods: list[TracePod] = [replace(p, request=r) for p, r in zip(originals, requests, strict=True)]
    arrivals = generate_arrivals(pods, nodes, seed, 1.3)
    card_memory = reference_card_memory(node_card_memories(nodes))
    engine_nodes = blind(nodes) if way == "blind" else nodes
    if way == PEER:
        engine: PlacementEngine = ranked_engine(engine_nodes, arrivals, get_policy("bestfit"),
                                                target_workload(get_policy("bestfit"), pods),
                                                seed)  # fmt: skip
        by_name = sorted(range(len(engine.names)), key=lambda r: engine.names[r])
        place = lambda pod: peer_place(engine, by_name, pod)  # noqa: E731
    else:
        spec = get_policy(policy)
        engine = ranked_engine(
            engine_nodes, arrivals, spec, target_workload(spec, pods, engine_nodes), seed
        )
        place = lambda pod: engine.place(pod) is not None  # noqa: E731
    return replay_counts(workload, variant, seed, way, policy, arrivals, place, card_memory, nodes)


def replay_counts(
    workload: str,
    variant: str,
    seed: int,
    way: str,
    policy: str,
    arrivals: Arrivals,
    place: object,
    card_memory: int | None,
    nodes: list[NodeState],
) -> Outcome:
    assert callable(place)
    count = len(arrivals.pods)
    arrived = np.zeros(count, dtype=np.int64)
    used = np.zeros(count, dtype=np.int64)
    arrived_total = used_total = gpu_pods = placed = 0
    first: int | None = None
    for e, pod in enumerate(arrivals.pods):
        demand = pod.gpu_count * pod.card_milli(card_memory)
        arrived_total += demand
        ok = place(pod)
        if pod.gpu_count:
            gpu_pods += 1
            placed += int(ok)
            if not ok and first is None:
                first = e
        if ok:
            used_total += demand
        arrived[e], used[e] = arrived_total, used_total
    total_gpus = sum(len(n.gpus) for n in nodes)
    columns = discretise(ReplayResult(arrived, used, total_gpus, gpu_pods - placed))
    return Outcome(
        workload, variant, seed, way, policy, columns[100] or 0.0, gpu_pods, placed, first
    )


DENSE_NODES, DENSE_CARDS, DENSE_CARD_MIB, DENSE_PODS = 50, 8, 81559, 2000


def dense_sizes(seed: int, count: int = DENSE_PODS, low: int = 1, high: int = 40) -> list[int]:
    """The dense row's pod sizes in whole GiB, uniform in ``low``-``high``, in arrival order."""
    rng = np.random.default_rng(seed)
    return [int(gib) for gib in rng.integers(low, high + 1, count)]


def dense(seed: int, way: str, policy: str) -> Outcome:
    """The issue's dense packing, in process: 2,000 gpushare-style pods of 1-40 GiB (uniform
    whole GiB, seeded) onto 50 nodes of eight 80 GB cards, CPU ample, no arrivals tuning:
    the order drawn is the order placed."""
    pods = [
        PodRequest(100, 256, 1, 1, gib * 1024, name=f"pod-{k:04d}")
        for k, gib in enumerate(dense_sizes(seed))
    ]
    total = None if way == "blind" else DENSE_CARD_MIB
    nodes = [
        NodeState(f"node-{i:03d}", 128_000, 128_000, 1 << 20, "H100",
                  tuple(GpuState(j, 1000, DENSE_CARD_MIB, "", total) for j in range(DENSE_CARDS)),
                  rank=i)
        for i in range(DENSE_NODES)
    ]  # fmt: skip
    spec = get_policy("bestfit" if way == PEER else policy)
    classes = [class_key(p, card_memory_mib=total) for p in pods]
    engine = PlacementEngine(nodes, spec, target(spec, classes))
    by_name = list(range(DENSE_NODES))
    placed, first = 0, None
    for k, pod in enumerate(pods):
        ok = peer_place(engine, by_name, pod) if way == PEER else engine.place(pod) is not None
        placed += int(ok)
        if not ok and first is None:
            first = k
    held = DENSE_NODES * DENSE_CARDS * DENSE_CARD_MIB - int(
        engine.card_memory[:, :DENSE_CARDS].sum()
    )
    used = 100 * held / (DENSE_NODES * DENSE_CARDS * DENSE_CARD_MIB)
    return Outcome("dense", "gpushare", seed, way, policy, used, DENSE_PODS, placed, first)


def seed_list(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """``--seeds`` as ``kubegpu simulate`` reads it (ranges and lists, checked); a bad one ends
    the script naming it."""
    try:
        return parse_seeds(text)
    except click.BadParameter as exc:
        parser.error(exc.format_message())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--workloads", default="default,gpushare100")
    parser.add_argument("--variants", default="openb,gpushare")
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--policies", default="bestfit,fgd,kubegpu")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds = seed_list(parser, args.seeds)
    policies = args.policies.split(",")
    ways = [(way, p) for way in ("levels", "blind") for p in policies] + [(PEER, "")]
    work = [
        (args.traces, w, v, s, way, p)
        for w in args.workloads.split(",")
        for v in args.variants.split(",")
        for s in seeds
        for way, p in ways
    ]
    dense_work = [(s, way, p) for s in seeds for way, p in ways]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, *zip(*work, strict=True)))
        results += list(pool.map(dense, *zip(*dense_work, strict=True)))
    header = [f"{p} ({way})" if p else way for way, p in ways]
    print("Per cell: allocation % at 100 % arrived / GPU pods placed % / first refusal (arrival #)")
    print("| Workload | Variant | " + " | ".join(header) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in header) + " |")
    rows = [(w, v) for w in args.workloads.split(",") for v in args.variants.split(",")]
    for w, v in [*rows, ("dense", "gpushare")]:
        cells = []
        for way, p in ways:
            got = [r for r in results if (r.workload, r.variant, r.way, r.policy) == (w, v, way, p)]
            alloc = statistics.mean(r.allocation_pct for r in got)
            share = statistics.mean(100 * r.placed / r.gpu_pods for r in got)
            firsts = [r.first_refused for r in got if r.first_refused is not None]
            first = f"{statistics.mean(firsts):.0f}" if firsts else "none"
            cells.append(f"{alloc:.2f} / {share:.2f} / {first}")
        print(f"| {w} | {v} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
