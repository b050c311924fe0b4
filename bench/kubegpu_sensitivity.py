"""How 07-Kubegpu's measured constants move its lead over FGD, and where the idle GPU goes.

    .venv/bin/python bench/kubegpu_sensitivity.py --traces ../shared/traces/openb \\
        [--workloads multigpu30,multigpu40,multigpu50] [--seeds 42-51] [--jobs 2] \\
        [--cpu-weight 0.5,0.75,1] [--share-percent 85] [--bucket 40]
    .venv/bin/python bench/kubegpu_sensitivity.py --traces ../shared/traces/openb --breakdown \\
        [--workloads default,gpushare40,multigpu40] [--seeds 42]

Sensitivity: for every combination of the given constants (``WasteWeights``), replays each
workload and seed with the paper's arrival fixtures and prints the mean allocation ratio at
100 % arrived minus the published FGD mean of the same seeds. The constants shipped in
``kubegpu.placement.waste`` are one point of this grid; docs/benchmarks.md has the figures.

Breakdown: replays FGD and 07-Kubegpu up to 100 % arrived and splits the GPU left idle into
cards too small for any common pod class (a gap below every class with ≥ 10 pods), free GPU on
nodes whose free CPU is below every such class that would fit ("stranded by CPU"), and the
rest (mostly 190-milli gaps beside 810-milli shares, which only the rare 160/110/50 fit).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.policies import get_policy
from kubegpu.placement.waste import WasteWeights
from kubegpu.simulate.arrivals import load_fixture
from kubegpu.simulate.command import parse_seeds, read_paper
from kubegpu.simulate.replay import (
    capacity_milli,
    discretise,
    ranked_engine,
    replay,
    target_workload,
)
from kubegpu.simulate.traces import load_nodes, load_pods


def _inputs(traces: Path, workload: str, seed: int):  # type: ignore[no-untyped-def]
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{workload}.csv")
    arrivals = load_fixture(
        traces / "arrivals" / f"openb_pod_list_{workload}_seed{seed}.txt.gz", pods, nodes
    )
    return nodes, pods, arrivals


def column_100(job: tuple[Path, str, int, WasteWeights]) -> float:
    traces, workload, seed, weights = job
    nodes, pods, arrivals = _inputs(traces, workload, seed)
    spec = get_policy("kubegpu")
    result = replay(nodes, arrivals, spec, target_workload(spec, pods), seed, weights)
    value = discretise(result)[100]
    assert value is not None
    return value


def idle_breakdown(traces: Path, workload: str, seed: int, policy: str) -> dict[str, float]:
    """Percent of cluster GPU capacity idle at 100 % arrived, by kind."""
    nodes, pods, arrivals = _inputs(traces, workload, seed)
    spec = get_policy(policy)
    engine: PlacementEngine = ranked_engine(
        nodes, arrivals, spec, target_workload(spec, pods), seed
    )
    capacity = capacity_milli(nodes)
    arrived = 0
    for pod in arrivals.pods:
        demand = pod.gpu_count * pod.gpu_milli
        if arrived + demand > capacity:
            break
        arrived += demand
        engine.place(pod)
    classes = Counter(
        (p.request.gpu_milli, p.request.cpu_milli) for p in pods if p.request.gpu_count == 1
    )
    common = [(milli, cpu) for (milli, cpu), n in classes.items() if n >= 10]
    kinds = {"too small for any common pod": 0, "stranded by CPU": 0, "other (mostly 190)": 0}
    for i in range(len(engine.names)):
        cpu_free = int(engine.cpu_free[i])
        for gap in engine.card_free[i, : engine.gpu_count[i]].tolist():
            if gap <= 0:
                continue
            cpus = [cpu for milli, cpu in common if milli <= gap]
            if not cpus:
                kinds["too small for any common pod"] += gap
            elif min(cpus) > cpu_free:
                kinds["stranded by CPU"] += gap
            else:
                kinds["other (mostly 190)"] += gap
    out = {kind: 100.0 * milli / capacity for kind, milli in kinds.items()}
    out["allocated"] = 100.0 * engine.gpu_used_milli / capacity
    return out


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--workloads", default="multigpu30,multigpu40,multigpu50")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    defaults = WasteWeights()
    parser.add_argument("--cpu-weight", default=str(defaults.cpu_weight))
    parser.add_argument("--share-percent", default=str(defaults.common_share_percent))
    parser.add_argument("--bucket", default=str(defaults.bucket_milli))
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    seeds = parse_seeds(args.seeds)

    if args.breakdown:
        print("| workload | seed | policy | allocated | too small | stranded by CPU | other |")
        print("|---|---|---|---|---|---|---|")
        for workload, seed, policy in itertools.product(workloads, seeds, ("fgd", "kubegpu")):
            b = idle_breakdown(args.traces, workload, seed, policy)
            print(
                f"| {workload} | {seed} | {policy} | {b['allocated']:.2f} | "
                f"{b['too small for any common pod']:.2f} | {b['stranded by CPU']:.2f} | "
                f"{b['other (mostly 190)']:.2f} |",
                flush=True,
            )
        return 0

    paper = read_paper(args.traces / "paper_allocation_ratio.csv")
    grid = [
        WasteWeights(percent, weight, bucket)
        for percent, weight, bucket in itertools.product(
            _floats(args.share_percent), _floats(args.cpu_weight), _floats(args.bucket)
        )
    ]
    print("| share % | CPU weight | bucket | " + " | ".join(workloads) + " | min |")
    print("|---" * (len(workloads) + 4) + "|")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for weights in grid:
            leads = []
            for workload in workloads:
                jobs = [(args.traces, workload, seed, weights) for seed in seeds]
                ours = list(pool.map(column_100, jobs))
                published = paper[(f"openb_pod_list_{workload}", "06-FGD")]
                fgd = [published[seed][100] for seed in seeds]
                leads.append(statistics.fmean(ours) - statistics.fmean(fgd))
            cells = " | ".join(f"{lead:+.2f}" for lead in leads)
            print(
                f"| {weights.common_share_percent:g} | {weights.cpu_weight:g} | "
                f"{weights.bucket_milli:g} | {cells} | {min(leads):+.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
