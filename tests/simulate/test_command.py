"""``kubegpu simulate`` as a real process on small traces made here, and its building blocks."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np

from kubegpu.placement.engine import PlacementEngine
from kubegpu.simulate.arrivals import generate_arrivals
from kubegpu.simulate.replay import ReplayResult, discretise, typical_workload
from kubegpu.simulate.traces import load_nodes, load_pods

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,32000,131072,2,T4
n-1,32000,131072,4,T4
n-2,64000,262144,8,V100M32
n-3,64000,262144,4,V100M16
"""

POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def write_pods(path: Path) -> Path:
    rows = []
    shapes = [
        (4000, 8192, 1, 500, ""),
        (2000, 4096, 1, 250, ""),
        (8000, 16384, 1, 1000, ""),
        (16000, 32768, 2, 1000, ""),
        (1000, 2048, 0, 0, ""),
        (6000, 8192, 1, 300, "V100M32|V100M16"),
    ]
    for i in range(30):
        cpu, mem, count, milli, spec = shapes[i % len(shapes)]
        rows.append(f"pod-{i:03d},{cpu},{mem},{count},{milli},{spec}\n")
    path.write_text(POD_HEADER + "".join(rows))
    return path


def simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_writes_the_paper_layout_summary_and_plot(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    out = tmp_path / "out"
    result = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,bestfit,kubegpu",
        "--seeds", "1-2", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with (out / "allocation.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["workload", "sc_policy", "tune", "seed", "total_gpus"] + [
        str(x) for x in range(131)
    ]
    assert sorted((r[1], r[3]) for r in rows[1:]) == [
        ("05-BestFit", "1"), ("05-BestFit", "2"), ("06-FGD", "1"), ("06-FGD", "2"),
        ("07-Kubegpu", "1"), ("07-Kubegpu", "2"),
    ]  # fmt: skip
    assert {r[0] for r in rows[1:]} == {"tiny"} and {r[4] for r in rows[1:]} == {"18"}
    assert "06-FGD" in result.stdout and "at 100 % arrived" in result.stdout
    assert (out / "allocation.png").stat().st_size > 10_000


def test_missing_column_exits_2_naming_file_line_and_column(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu\npod-0,1000,1024,0\n")
    result = simulate("--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert f"{pods}:1: column 'gpu_milli': missing column" in result.stderr


def test_malformed_value_exits_2_naming_file_line_and_column(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES.replace("n-2,64000,", "n-2,lots,"))
    pods = write_pods(tmp_path / "pods.csv")
    result = simulate("--nodes", str(nodes), "--pods", str(pods), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert f"{nodes}:4: column 'cpu_milli': not an integer: 'lots'" in result.stderr


def test_model_constrained_pods_only_land_on_allowed_models(tmp_path: Path) -> None:
    nodes_path = tmp_path / "nodes.csv"
    nodes_path.write_text(NODES)
    nodes = load_nodes(nodes_path)
    pods = load_pods(write_pods(tmp_path / "pods.csv"))
    arrivals = generate_arrivals(pods, nodes, seed=3, inflation=1.3)
    models = {n.name: n.gpu_model for n in nodes}
    for policy in ("fgd", "bestfit", "gpupacking", "random"):
        engine = PlacementEngine(nodes, policy, typical_workload([p.request for p in pods]))
        constrained = 0
        for pod in arrivals.pods:
            placement = engine.place(pod)
            if placement is not None and pod.gpu_models:
                constrained += 1
                assert models[placement.node] in pod.gpu_models, policy
        assert constrained > 0


def test_generated_arrivals_tune_demand_up_to_the_inflation_target(tmp_path: Path) -> None:
    nodes_path = tmp_path / "nodes.csv"
    nodes_path.write_text(NODES)
    nodes = load_nodes(nodes_path)
    pods = load_pods(write_pods(tmp_path / "pods.csv"))
    arrivals = generate_arrivals(pods, nodes, seed=5, inflation=1.3)
    demand = sum(p.total_gpu_milli for p in arrivals.pods)
    assert 1.3 * 18_000 - 1000 < demand <= 1.3 * 18_000
    assert {p.name for p in arrivals.pods[:30]} == {p.name for p in pods}  # originals first
    assert all("-tuned-" in p.name for p in arrivals.pods[30:])
    assert sorted(arrivals.node_ranks.values()) == [0, 1, 2, 3]
    assert generate_arrivals(pods, nodes, seed=5, inflation=1.3) == arrivals


def test_generated_arrivals_drop_pods_when_the_trace_exceeds_the_target(tmp_path: Path) -> None:
    nodes_path = tmp_path / "nodes.csv"
    nodes_path.write_text(NODES)
    nodes = load_nodes(nodes_path)
    pods = load_pods(write_pods(tmp_path / "pods.csv"))
    arrivals = generate_arrivals(pods, nodes, seed=5, inflation=0.5)
    assert sum(p.total_gpu_milli for p in arrivals.pods) <= 0.5 * 18_000
    assert len(arrivals.pods) < len(pods)


def test_discretisation_averages_events_per_arrived_percent_with_neighbour_fallback() -> None:
    # 1 GPU cluster: 10 milli arrived = 1 %. Events at 0 %, 1 %, 1 %, 3 % arrived.
    result = ReplayResult(
        arrived_milli=np.array([0, 10, 12, 30]),
        used_milli=np.array([0, 10, 11, 20]),
        total_gpus=1,
        failed_pods=0,
    )
    columns = discretise(result)
    assert columns[:5] == [0.0, 1.05, 1.37, 2.0, 2.0]  # col 2: mean of 1 %,1 %,3 % events
    assert columns[5] is None
