"""How far from the limit: FGD, 07-Kubegpu, the offline packing and the upper bound on the
allocation ratio at 100 % arrived, for the 17 workloads of docs/benchmarks.md (issue 31).

    .venv/bin/python bench/bound_table.py --traces ../shared/traces/openb --work /tmp/bound \\
        --jobs 2 [--seeds 42-51] [--plot docs/images/openb-bound.png] \\
        [--analysis [--analysis-seeds 42-51]]

* The 13 shared workloads use the paper's arrival fixtures; the 4 model-constrained ones
  (``default_c10/c20/c25/c33``) are made in ``--work`` as ``bench/model_constrained.py``
  makes them (``kubegpu trace constrain --seed 14``, fixtures for seeds 42–51).
* FGD: the published rows on the shared workloads (ours equal them), run here on the
  constrained ones; 07-Kubegpu: run here with the shipped constants; both cached in
  ``--work/results.jsonl`` (the cache ``bench/model_constrained.py`` keeps, so the two
  scripts share runs). The bound and the offline packing
  (``kubegpu.simulate.hindsight``, what ``kubegpu simulate --bound`` prints) are cached in
  ``--work/hindsight.jsonl`` with their CPU seconds.
* Prints the markdown table: per workload the 10-seed means, the gap each leaves to the
  bound, and the share of FGD's gap to the bound that 07-Kubegpu closes,
  ``(ours − FGD) / (bound − FGD)``; ``--plot`` draws the points below the bound.
* ``--analysis``: for each workload and seed, the GPU pods arrived by the column's last event
  that 07-Kubegpu refused and the offline packing placed (and the reverse), by pod shape, and
  why 07-Kubegpu refused them (no card with room anywhere, or no CPU or memory beside one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

# Run as a script, this folder is on sys.path: model_constrained's cache and traces serve both.
from model_constrained import GENERATED, HALF_A, HALF_B, Results, generate, needed, ours_key

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.model import NodeState, PodRequest
from kubegpu.placement.policies import get_policy
from kubegpu.placement.waste import WasteWeights
from kubegpu.simulate.arrivals import Arrivals, load_fixture
from kubegpu.simulate.bound import relax
from kubegpu.simulate.command import parse_seeds
from kubegpu.simulate.hindsight import hindsight
from kubegpu.simulate.replay import ranked_engine, target_workload
from kubegpu.simulate.traces import TracePod, load_nodes, load_pods

WORKLOADS = (
    "default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60",
    "gpushare80", "gpushare100", "multigpu20", "multigpu30", "multigpu40", "multigpu50",
    *GENERATED,
)  # fmt: skip
assert set(WORKLOADS) == set(HALF_A + HALF_B)
REFUSED = "online refused, offline placed"
WHY = "why refused"
LEFT_OUT = "online placed, offline refused"
AT_LAST = "at the last event"


def _inputs(
    traces: Path, work: Path, workload: str, seed: int
) -> tuple[list[NodeState], list[TracePod], Arrivals]:
    base = work if workload in GENERATED else traces
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(base / f"openb_pod_list_{workload}.csv")
    fixture = base / "arrivals" / f"openb_pod_list_{workload}_seed{seed}.txt.gz"
    return nodes, pods, load_fixture(fixture, pods, nodes)


def run_hindsight(job: tuple[Path, Path, str, int]) -> dict[str, object]:
    """The bound alone (timed), then the bound with the offline packing."""
    traces, work, workload, seed = job
    nodes, _, arrivals = _inputs(traces, work, workload, seed)
    started = time.process_time()
    bound = hindsight(nodes, arrivals.pods, pack=False)
    bound_cpu = time.process_time() - started
    started = time.process_time()
    both = hindsight(nodes, arrivals.pods)
    total = sum(len(n.gpus) for n in nodes) * 1000
    return {
        "workload": workload,
        "seed": seed,
        "bound": bound.bound_column[100],
        "offline": both.offline_column[100],
        "bound_last": 100 * bound.bound_milli / total,
        "offline_last": 100 * both.offline_milli / total,
        "arrived_last": 100 * both.arrived_milli / total,
        "bound_cpu_s": bound_cpu,
        "both_cpu_s": time.process_time() - started,
    }


class Hindsights:
    def __init__(self, traces: Path, work: Path, jobs: int) -> None:
        self.traces, self.work, self.jobs = traces, work, jobs
        self.path = work / "hindsight.jsonl"
        self.rows: dict[tuple[str, int], dict[str, object]] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                row = json.loads(line)
                self.rows[(str(row["workload"]), int(row["seed"]))] = row

    def ensure(self, keys: list[tuple[str, int]]) -> None:
        missing = [k for k in keys if k not in self.rows]
        if not missing:
            return
        print(f"computing {len(missing)} bounds and packings", file=sys.stderr)
        with ProcessPoolExecutor(self.jobs) as pool, self.path.open("a") as out:
            futures = [
                pool.submit(run_hindsight, (self.traces, self.work, w, s)) for w, s in missing
            ]
            for future in as_completed(futures):
                row = future.result()
                self.rows[(str(row["workload"]), int(str(row["seed"])))] = row
                out.write(json.dumps(row) + "\n")
                out.flush()

    def value(self, workload: str, seed: int, field: str) -> float:
        return float(str(self.rows[(workload, seed)][field]))

    def mean(self, workload: str, seeds: list[int], field: str) -> float:
        return statistics.fmean(self.value(workload, s, field) for s in seeds)


def table(
    results: Results, hind: Hindsights, seeds: list[int]
) -> tuple[list[str], dict[str, tuple[float, ...]]]:
    weights = WasteWeights()
    lines = [
        "| workload | 06-FGD | 07-Kubegpu | offline packing | upper bound | FGD to bound "
        "| ours to bound | offline to bound | FGD's gap closed by ours |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    points: dict[str, tuple[float, ...]] = {}
    shares = []
    for w in WORKLOADS:
        fgd = results.fgd(w, tuple(seeds))
        ours = results.ours(w, tuple(seeds), weights)
        offline = hind.mean(w, seeds, "offline")
        bound = hind.mean(w, seeds, "bound")
        share = (ours - fgd) / (bound - fgd) if bound > fgd else float("nan")
        shares.append(share)
        points[w] = (fgd, ours, offline, bound)
        lines.append(
            f"| {w} | {fgd:.2f} | {ours:.2f} | {offline:.2f} | {bound:.2f} | {bound - fgd:.2f} "
            f"| {bound - ours:.2f} | {bound - offline:.2f} | {100 * share:.0f} % |"
        )
    mean = [statistics.fmean(p[i] for p in points.values()) for i in range(4)]
    lines.append(
        f"| mean | {mean[0]:.2f} | {mean[1]:.2f} | {mean[2]:.2f} | {mean[3]:.2f} "
        f"| {mean[3] - mean[0]:.2f} | {mean[3] - mean[1]:.2f} | {mean[3] - mean[2]:.2f} "
        f"| {100 * statistics.fmean(shares):.0f} % (of the mean gaps: "
        f"{100 * (mean[1] - mean[0]) / (mean[3] - mean[0]):.0f} %) |"
    )
    keys = [(w, s) for w in WORKLOADS for s in seeds]
    bound_cpu = [hind.value(w, s, "bound_cpu_s") for w, s in keys]
    both_cpu = [hind.value(w, s, "both_cpu_s") for w, s in keys]
    lines.append("")
    lines.append(
        f"Bound alone, CPU s per workload and seed: mean {statistics.fmean(bound_cpu):.2f}, "
        f"max {max(bound_cpu):.2f}; bound and offline packing: mean "
        f"{statistics.fmean(both_cpu):.2f}, max {max(both_cpu):.2f} ({len(keys)} runs)."
    )
    over = [
        (w, s)
        for w, s in keys
        if max(results.values[ours_key(w, s, weights)], results.fgd(w, (s,)))
        > hind.value(w, s, "bound")
    ]
    ahead = [
        (w, s)
        for w, s in keys
        if results.values[ours_key(w, s, weights)] > hind.value(w, s, "offline")
    ]
    lines.append(f"Workload-seeds where FGD or 07-Kubegpu exceeds the bound: {len(over)}.")
    lines.append(
        f"Workload-seeds where 07-Kubegpu exceeds the offline packing: {len(ahead)} {ahead}."
    )
    return lines, points


def plot(points: dict[str, tuple[float, ...]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(points)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    styles = (
        ("06-FGD", "s", "tab:red"),
        ("07-Kubegpu", "o", "tab:blue"),
        ("offline packing", "^", "tab:green"),
    )
    for i, (label, marker, colour) in enumerate(styles):
        xs = [points[w][i] - points[w][3] for w in names]
        ax.scatter(xs, range(len(names)), marker=marker, color=colour, label=label, zorder=3)
    for y, w in enumerate(names):
        ax.plot([points[w][0] - points[w][3], 0], [y, y], color="0.8", linewidth=1, zorder=1)
    ax.axvline(0, color="black", linewidth=1, label="upper bound")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("allocation ratio at 100 % arrived minus the upper bound (pp), seeds 42–51")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _why_not(engine: PlacementEngine, pod: PodRequest) -> str:
    """Why no node takes ``pod`` now: "cards" when no node of an allowed model has a card
    (whole cards: enough fully free ones) for it, whatever its CPU; else "CPU or memory"."""
    if pod.gpu_count == 0 or engine.feasible_rows(pod).size:
        return "fits"
    rows = np.arange(len(engine.names))
    if pod.gpu_models:
        rows = rows[engine.model_selection(pod.gpu_models).rows[rows]]
    if pod.gpu_milli >= 1000:
        room = engine.full_cards[rows] >= pod.gpu_count
    else:
        room = engine.largest_card[rows] >= pod.gpu_milli
    return "CPU or memory" if room.any() else "cards"


def analyse_one(job: tuple[Path, Path, str, int]) -> dict[str, Counter[str]]:
    """Percentage points of capacity in the pods arrived by the column's last event, by
    shape: refused online and placed offline (and why refused), placed online and left out
    offline; and at that event: each side's GPU, the bound, and the bound when the CPU-only
    pods both FGD and 07-Kubegpu placed must be placed too."""
    traces, work, workload, seed = job
    nodes, pods, arrivals = _inputs(traces, work, workload, seed)
    found = hindsight(nodes, arrivals.pods)
    assert found.packing is not None
    prefix = arrivals.pods[: found.last_event + 1]
    placed: dict[str, list[bool]] = {}
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for name in ("fgd", "kubegpu"):
        spec = get_policy(name)
        engine = ranked_engine(nodes, arrivals, spec, target_workload(spec, pods), seed)
        placed[name] = []
        for pod, slot in zip(prefix, found.packing.slots, strict=True):
            reason = _why_not(engine, pod)
            online = engine.place(pod) is not None
            placed[name].append(online)
            if name == "fgd" or not pod.gpu_count or online == (slot is not None):
                continue
            shape = f"{pod.gpu_count}x1000" if pod.gpu_milli == 1000 else f"share {pod.gpu_milli}"
            if pod.gpu_models:
                shape += " (model-limited)"
            if slot:
                out[REFUSED][shape] += pod.total_gpu_milli
                out[WHY][reason] += pod.total_gpu_milli
            else:
                out[LEFT_OUT][shape] += pod.total_gpu_milli
        out[AT_LAST][name] = sum(
            p.total_gpu_milli for p, ok in zip(prefix, placed[name], strict=True) if ok
        )
    seated = [
        p
        for p, a, b in zip(prefix, placed["fgd"], placed["kubegpu"], strict=True)
        if a and b and not p.gpu_count
    ]
    arrived = found.arrived_milli
    out[AT_LAST]["bound"] = min(arrived, found.bound_milli)
    out[AT_LAST]["bound, CPU-only pods seated"] = min(
        arrived, relax(nodes, prefix, seated).solve().bound_milli
    )
    out[AT_LAST]["offline"] = found.offline_milli
    out[AT_LAST]["CPU-only pods: arrived"] = sum(100 for p in prefix if not p.gpu_count)
    out[AT_LAST]["CPU-only pods: seated by both"] = 100 * len(seated)
    out[AT_LAST]["CPU-only pods: offline"] = sum(
        100 for p, s in zip(prefix, found.packing.slots, strict=True) if s and not p.gpu_count
    )
    per_point = sum(len(n.gpus) for n in nodes) * 10  # milli per percentage point
    return {side: Counter({k: v / per_point for k, v in c.items()}) for side, c in out.items()}


def analysis(traces: Path, work: Path, seeds: list[int], jobs: int) -> list[str]:
    totals: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    with ProcessPoolExecutor(jobs) as pool:
        futures = {
            pool.submit(analyse_one, (traces, work, w, s)): w for w in WORKLOADS for s in seeds
        }
        for future in as_completed(futures):
            for side, counts in future.result().items():
                totals[futures[future]][side].update(counts)
    n = len(seeds)
    lines = [
        "| workload | refused by 07-Kubegpu, placed offline (pp; largest shapes) "
        "| why refused (pp) | placed by 07-Kubegpu, left out offline (pp; largest shapes) |",
        "|---|---|---|---|",
    ]
    for w in WORKLOADS:
        cells = []
        for side in (REFUSED, WHY, LEFT_OUT):
            counts = totals[w][side]
            top = ", ".join(f"{k} {v / n:.2f}" for k, v in counts.most_common(4))
            cells.append(f"{sum(counts.values()) / n:.2f}: {top}")
        lines.append(f"| {w} | {cells[0]} | {cells[1]} | {cells[2]} |")
    lines += ["", "At the column's last event (mean pp of capacity; pod counts / 62.12):", ""]
    keys = list(totals[WORKLOADS[0]][AT_LAST])
    lines.append("| workload | " + " | ".join(keys) + " |")
    lines.append("|---|" + "---|" * len(keys))
    for w in WORKLOADS:
        at = totals[w][AT_LAST]
        lines.append(f"| {w} | " + " | ".join(f"{at[k] / n:.2f}" for k in keys) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces/openb"))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--analysis", action="store_true")
    parser.add_argument("--analysis-seeds", default="42-51", help="the seeds --analysis replays")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    args.work.mkdir(parents=True, exist_ok=True)
    generate(args.traces, args.work)
    results = Results(args.traces, args.work, args.jobs)
    results.ensure([k for w in WORKLOADS for k in needed((w,), tuple(seeds), WasteWeights())])
    hind = Hindsights(args.traces, args.work, args.jobs)
    hind.ensure([(w, s) for w in WORKLOADS for s in seeds])
    lines, points = table(results, hind, seeds)
    if args.plot is not None:
        plot(points, args.plot)
        lines.append(f"Plot: {args.plot}")
    if args.analysis:
        lines.append("")
        lines += analysis(args.traces, args.work, parse_seeds(args.analysis_seeds), args.jobs)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
