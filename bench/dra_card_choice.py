"""Placement quality under DRA: our full card choice against DRA's first fit, and steered.

    .venv/bin/python bench/dra_card_choice.py --traces ../shared/traces/openb --out /tmp/dra \
        --jobs 2 [--workloads default,gpushare40,gpushare100,multigpu50] [--seeds 42-46] \
        [--summarise-only]

Runs ``kubegpu simulate --policy kubegpu --card-choice policy,first-fit,steered`` with the
paper's arrival fixtures, then prints a markdown table: per workload, the mean allocation
ratio at 100 % arrived of each card choice, the gap first fit leaves (full − first fit) and
how much of it steering closes ((steered − first fit) / (full − first fit)).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

DEFAULT_WORKLOADS = "default,gpushare40,gpushare100,multigpu50"
LABELS = ("07-Kubegpu", "07-Kubegpu first-fit", "07-Kubegpu steered")


def run(traces: Path, out: Path, workloads: list[str], seeds: str, jobs: int) -> float:
    from kubegpu.simulate.command import simulate

    args = ["--nodes", str(traces / "openb_node_list_gpu_node.csv")]
    for workload in workloads:
        args += ["--pods", str(traces / f"openb_pod_list_{workload}.csv")]
    args += ["--policy", "kubegpu", "--card-choice", "policy,first-fit,steered"]
    args += ["--seeds", seeds, "--arrivals", str(traces / "arrivals")]
    args += ["--out", str(out), "--jobs", str(jobs), "--no-plot"]
    started = time.perf_counter()
    simulate.main(args, standalone_mode=False)
    return time.perf_counter() - started


def summarise(out: Path, workloads: list[str]) -> str:
    at_100: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    with (out / "allocation.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            workload = row["workload"].removeprefix("openb_pod_list_")
            at_100[(workload, row["sc_policy"])][int(row["seed"])] = float(row["100"])
    lines = [
        "| workload | seeds | full card choice | first fit | steered | gap (full − first fit) "
        "| steered − first fit | gap closed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload in workloads:
        runs = [at_100.get((workload, label), {}) for label in LABELS]
        seeds = sorted(set.intersection(*(set(r) for r in runs)))
        if not seeds:
            continue
        full, first, steered = (statistics.fmean(r[s] for s in seeds) for r in runs)
        gap, gain = full - first, steered - first
        closed = f"{100 * gain / gap:.0f} %" if gap > 0.005 else "–"
        lines.append(
            f"| {workload} | {len(seeds)} | {full:.2f} | {first:.2f} | {steered:.2f} "
            f"| {gap:+.2f} | {gain:+.2f} | {closed} |"
        )
    cpu: dict[str, list[float]] = defaultdict(list)
    with (out / "runs.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            cpu[row["sc_policy"]].append(float(row["cpu_s"]))
    lines.append("")
    lines.append(
        "CPU s per run, mean: "
        + ", ".join(f"{label} {statistics.fmean(cpu[label]):.1f}" for label in LABELS if cpu[label])
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces/openb"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    parser.add_argument("--seeds", default="42-46")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--summarise-only", action="store_true")
    args = parser.parse_args()
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not args.summarise_only:
        wall = run(args.traces, args.out, workloads, args.seeds, args.jobs)
        print(f"wall time: {wall / 60:.1f} min with {args.jobs} jobs", file=sys.stderr)
    print(summarise(args.out, workloads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
