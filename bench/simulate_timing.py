"""CPU time of the trace simulator's replay loop alone, best of N, per policy.

``kubegpu simulate`` under ``/usr/bin/time`` includes imports and CSV parsing and, on a
machine shared with other jobs, swings by seconds; this times only ``replay`` (the placement
engine's work), in this process's CPU time, and keeps the best of ``--repeat`` runs, which is
what a refactor of the engine must not slow down. The policies take turns within each
repeat. Run it at two commits with the same arguments to compare (``PYTHONPATH=<other
checkout>/src`` runs the other one's engine). ``--traces`` is any folder holding the node
list, ``openb_pod_list_<workload>.csv`` and ``arrivals/`` (e.g. one ``kubegpu trace
constrain`` and ``kubegpu trace arrivals`` wrote, with the node list copied in).

    .venv/bin/python bench/simulate_timing.py --traces ../shared/traces/openb \
        --workload default --policy fgd,bestfit,kubegpu --seed 42 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kubegpu.placement.policies import get_policy
from kubegpu.simulate.arrivals import load_fixture
from kubegpu.simulate.replay import replay, target_workload
from kubegpu.simulate.traces import load_nodes, load_pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--workload", default="default")
    parser.add_argument("--policy", default="fgd,bestfit,kubegpu")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(args.traces / f"openb_pod_list_{args.workload}.csv")
    fixture = args.traces / "arrivals" / f"openb_pod_list_{args.workload}_seed{args.seed}.txt.gz"
    arrivals = load_fixture(fixture, pods, nodes)
    specs = [get_policy(name) for name in args.policy.split(",")]
    workloads = {spec.label: target_workload(spec, pods) for spec in specs}
    times: dict[str, list[float]] = {spec.label: [] for spec in specs}
    used: dict[str, int] = {}
    # Policies take turns within each repeat, so a neighbour's burst on a shared machine
    # lands on all of them alike rather than on whichever ran during it.
    for _ in range(args.repeat):
        for spec in specs:
            started = time.process_time()
            result = replay(nodes, arrivals, spec, workloads[spec.label], args.seed)
            times[spec.label].append(time.process_time() - started)
            used[spec.label] = int(result.used_milli[-1])
    out: dict[str, dict[str, float]] = {
        label: {
            "best_cpu_s": min(runs),
            "median_cpu_s": sorted(runs)[len(runs) // 2],
            "used_milli": used[label],
        }
        for label, runs in times.items()
    }
    if args.json:
        print(json.dumps(out))
    else:
        for label, row in out.items():
            print(
                f"{label}: best {row['best_cpu_s']:.3f} s, median {row['median_cpu_s']:.3f} s "
                f"CPU over {args.repeat} replays (used milli at the end {row['used_milli']})"
            )


if __name__ == "__main__":
    main()
