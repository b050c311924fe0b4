"""Every placement of a replay, hashed: the proof that a speed-up changed no decision.

``kubegpu simulate``'s allocation.csv is the discretised curve, which two different sets of
placements can share; this replays the same arrivals and hashes, per policy, the node and the
card indices of every pod in arrival order (an unplaced pod hashes as such). Run it at two
commits (``PYTHONPATH=<other checkout>/src`` runs the other one's engine) and compare.

    .venv/bin/python bench/placement_digest.py --traces ../shared/traces/openb \
        --workload default --seeds 42,43 --policy all
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from kubegpu.placement.policies import get_policy, simulator_policies
from kubegpu.simulate.arrivals import load_fixture
from kubegpu.simulate.replay import ranked_engine, target_workload
from kubegpu.simulate.traces import load_nodes, load_pods


def digest(traces: Path, workload: str, seed: int, policy: str) -> tuple[str, int]:
    """SHA-256 of every placement (node, card indices; or "-" when unplaced) and the count of
    pods placed."""
    nodes = load_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_pods(traces / f"openb_pod_list_{workload}.csv")
    fixture = traces / "arrivals" / f"openb_pod_list_{workload}_seed{seed}.txt.gz"
    arrivals = load_fixture(fixture, pods, nodes)
    spec = get_policy(policy)
    engine = ranked_engine(nodes, arrivals, spec, target_workload(spec, pods), seed)
    sha = hashlib.sha256()
    placed = 0
    for pod in arrivals.pods:
        found = engine.place(pod)
        if found is None:
            sha.update(b"-\n")
            continue
        placed += 1
        sha.update(f"{found.node} {','.join(map(str, found.gpu_indices))}\n".encode())
    return sha.hexdigest(), placed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, required=True)
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--policy", default="all")
    args = parser.parse_args()
    names = (
        [p.name for p in simulator_policies()] if args.policy == "all" else args.policy.split(",")
    )
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in names:
            sha, placed = digest(args.traces, args.workload, seed, name)
            row = {"workload": args.workload, "seed": seed, "policy": name}
            print(json.dumps({**row, "placed": placed, "sha256": sha}))


if __name__ == "__main__":
    main()
