"""The FGD paper's full trace grid through ``kubegpu simulate``, summarised for docs/benchmarks.md.

    .venv/bin/python bench/simulate_grid.py --traces ../shared/traces/openb --out /tmp/grid \
        --jobs 2 [--policy all] [--seeds 42-51] [--summarise-only]

Runs 13 workloads × policies × seeds with the paper's arrival fixtures, then prints a markdown
table: per workload, each policy's mean allocation ratio at 100 % arrived next to the paper's,
how many rows equal the published row in all 131 columns, and the per-run wall time.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

WORKLOADS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
LABELS = (
    "01-Random",
    "02-DotProd",
    "03-GpuClustering",
    "04-GpuPacking",
    "05-BestFit",
    "06-FGD",
    "07-Kubegpu",
)


def run_grid(traces: Path, out: Path, policy: str, seeds: str, jobs: int) -> float:
    from kubegpu.simulate.command import simulate

    args = ["--nodes", str(traces / "openb_node_list_gpu_node.csv")]
    for workload in WORKLOADS:
        args += ["--pods", str(traces / f"openb_pod_list_{workload}.csv")]
    args += ["--policy", policy, "--seeds", seeds, "--arrivals", str(traces / "arrivals")]
    args += ["--paper", str(traces / "paper_allocation_ratio.csv"), "--out", str(out)]
    args += ["--jobs", str(jobs)]
    started = time.perf_counter()
    simulate.main(args, standalone_mode=False)
    return time.perf_counter() - started


def read_rows(path: Path) -> dict[tuple[str, str], dict[int, list[str]]]:
    rows: dict[tuple[str, str], dict[int, list[str]]] = defaultdict(dict)
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            values = [row[str(x)] for x in range(131)]
            workload = row["workload"].removeprefix("openb_pod_list_")
            rows[(workload, row["sc_policy"])][int(row["seed"])] = values
    return rows


def summarise(traces: Path, out: Path) -> str:
    ours = read_rows(out / "allocation.csv")
    paper = read_rows(traces / "paper_allocation_ratio.csv")
    lines = [
        "| workload | " + " | ".join(LABELS) + " | Kubegpu − FGD |",
        "|---|" + "---|" * (len(LABELS) + 1),
    ]
    exact = total = 0
    for workload in WORKLOADS:
        cells = []
        means: dict[str, float] = {}
        for label in LABELS:
            mine = ours.get((workload, label), {})
            theirs = paper.get((workload, label), {})
            if not mine:
                cells.append("–")
                continue
            mean = statistics.fmean(float(v[100]) for v in mine.values())
            means[label] = mean
            if theirs:
                paper_mean = statistics.fmean(float(v[100]) for v in theirs.values())
                if label != "01-Random":
                    total += len(mine)
                    exact += sum(
                        1
                        for seed, v in mine.items()
                        if [float(x) for x in v] == [float(x) for x in theirs.get(seed, [])]
                    )
                cells.append(f"{mean:.2f} / {paper_mean:.2f}")
            else:
                cells.append(f"**{mean:.2f}**")
        gain = (
            f"{means['07-Kubegpu'] - means['06-FGD']:+.2f}"
            if "07-Kubegpu" in means and "06-FGD" in means
            else "–"
        )
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | {gain} |")
    lines.append("")
    lines.append(f"Deterministic paper policies: {exact}/{total} rows equal the published row.")
    walls: dict[str, list[float]] = defaultdict(list)
    cpus: dict[str, list[float]] = defaultdict(list)
    rss: list[float] = []
    with (out / "runs.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            walls[row["sc_policy"]].append(float(row["wall_s"]))
            if row.get("cpu_s"):  # runs.csv before the column existed has none
                cpus[row["sc_policy"]].append(float(row["cpu_s"]))
            rss.append(float(row["max_rss_mib"]))
    lines.append("")
    lines.append("| policy | runs | mean wall s/run | max wall s/run | mean CPU s/run |")
    lines.append("|---|---|---|---|---|")
    for label in LABELS:
        if walls.get(label):
            w, c = walls[label], cpus.get(label)
            cpu = f"{statistics.fmean(c):.2f}" if c else "–"
            lines.append(
                f"| {label} | {len(w)} | {statistics.fmean(w):.2f} | {max(w):.2f} | {cpu} |"
            )
    lines.append("")
    lines.append(f"Largest worker peak RSS: {max(rss):.0f} MiB.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces/openb"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--policy", default="all")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--summarise-only", action="store_true")
    args = parser.parse_args()
    if not args.summarise_only:
        wall = run_grid(args.traces, args.out, args.policy, args.seeds, args.jobs)
        print(f"grid wall time: {wall / 60:.1f} min with {args.jobs} jobs", file=sys.stderr)
    print(summarise(args.traces, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
