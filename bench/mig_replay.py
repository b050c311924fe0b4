"""openb on MIG cards: the trace variant where each pod asks for a MIG profile
(kubegpu.simulate.mig), replayed with first fit (what DRA's allocator and nvidia-smi do) and
with packing, at 100 % arrived, on the openb GPU nodes with every card an H100 in MIG mode.

    .venv/bin/python bench/mig_replay.py --traces ../shared/traces/openb \\
        [--workloads default,gpushare100,multigpu50] [--seeds 42-44] [--jobs 2]

Prints one Markdown row per workload: the mean over the seeds of the compute slices allocated
(of the cluster's 7 per card) and of the GPU pods refused, per policy. Arrivals are the paper's
method with our seeded generator (kubegpu.simulate.arrivals.generate_arrivals), as for the
generated traces; nothing here is tuned.
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from memory_only_replay import seed_list

from kubegpu.simulate.arrivals import generate_arrivals
from kubegpu.simulate.mig import MIG_POLICIES, MigResult, mig_variant, replay_mig
from kubegpu.simulate.traces import load_nodes, load_pods


def run(traces: Path, workload: str, seed: int, policy: str) -> tuple[str, int, MigResult]:
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{workload}.csv")
    arrivals = generate_arrivals(pods, nodes, seed, 1.0)
    return workload, seed, replay_mig(nodes, mig_variant(arrivals.pods), policy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--workloads", default="default,gpushare100,multigpu50")
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    seeds = seed_list(parser, args.seeds)
    work = [
        (args.traces, w, s, p)
        for w in args.workloads.split(",")
        for s in seeds
        for p in MIG_POLICIES
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run, *zip(*work, strict=True)))
    print(
        "| Workload | "
        + " | ".join(f"{p}: slices allocated, GPU pods refused" for p in MIG_POLICIES)
        + " |"
    )
    print("| --- | " + " | ".join("---" for _ in MIG_POLICIES) + " |")
    for workload in args.workloads.split(","):
        cells = []
        for policy in MIG_POLICIES:
            mine = [r for w, _, r in results if w == workload and r.policy == policy]
            ratio = statistics.mean(r.allocation_ratio for r in mine) * 100
            refused = statistics.mean(r.refused for r in mine)
            cells.append(f"{ratio:.2f} %, {refused:.0f}")
        print(f"| {workload} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
