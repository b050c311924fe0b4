"""The bound and the offline packing of a replay (``kubegpu.simulate.hindsight``), and
``kubegpu simulate --bound``: no policy's figure at 100 % arrived is ever above the bound."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from kubegpu.placement.policies import simulator_policies
from kubegpu.simulate.arrivals import generate_arrivals, load_fixture
from kubegpu.simulate.command import read_paper
from kubegpu.simulate.hindsight import column_events, hindsight
from kubegpu.simulate.offline import verify
from kubegpu.simulate.replay import ReplayResult, discretise, replay, target_workload
from kubegpu.simulate.traces import load_nodes, load_pods
from tests.simulate.test_command import NODES, POD_HEADER, simulate


def write_pods(path: Path) -> Path:
    """A pod list in small steps of GPU demand (most under 1 % of the 18 cards of NODES), so
    that some arrivals round to exactly 100 % arrived."""
    shapes = [
        (4000, 8192, 1, 150, ""), (2000, 4096, 1, 100, ""), (6000, 8192, 1, 170, ""),
        (1000, 2048, 0, 0, ""), (3000, 4096, 1, 120, "V100M32|V100M16"),
        (8000, 16384, 1, 1000, ""), (5000, 8192, 1, 160, "T4"), (2000, 4096, 1, 130, ""),
    ]  # fmt: skip
    rows = [
        f"pod-{i:03d},{','.join(str(v) for v in shapes[i % len(shapes)])}\n" for i in range(120)
    ]
    path.write_text(POD_HEADER + "".join(rows))
    return path


def test_column_events_are_those_discretise_averages() -> None:
    # 1 GPU: 10 milli = 1 %. No event rounds to 2 %, so column 2 falls back to 1–3 %.
    arrived = np.array([0, 10, 12, 30, 41])
    assert column_events(arrived, 1, 1) == [1, 2]
    assert column_events(arrived, 1, 2) == [1, 2, 3]
    assert column_events(arrived, 1, 7) == []
    used = np.array([0, 10, 11, 20, 20])
    for column in (1, 2):
        mine = [float(round(used[e] / 10, 2)) for e in column_events(arrived, 1, column)]
        expected = discretise(ReplayResult(arrived, used, 1, 0))[column]
        assert round(sum(mine) / len(mine), 2) == expected


def test_no_policy_beats_the_bound_on_small_traces(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    nodes = load_nodes(tmp_path / "nodes.csv")
    pods = load_pods(write_pods(tmp_path / "pods.csv"))
    for seed in range(1, 6):
        arrivals = generate_arrivals(pods, nodes, seed, inflation=1.3)
        found = hindsight(nodes, arrivals.pods)
        assert verify(nodes, arrivals.pods[: found.last_event + 1], found.packing) > 0
        bound, offline = found.bound_column[100], found.offline_column[100]
        assert bound is not None and offline is not None
        assert offline <= bound
        assert sum(v is not None for v in found.bound_column) == 1  # column 100 alone
        for spec in simulator_policies():
            result = replay(nodes, arrivals, spec, target_workload(spec, pods), seed)
            assert (discretise(result)[100] or 0.0) <= bound, (seed, spec.name)
            assert int(result.used_milli[found.last_event]) <= found.bound_milli
    assert hindsight(nodes, []).bound_column[100] is None  # nothing arrived: no column


@pytest.mark.slow
@pytest.mark.timeout(240)  # 13 workloads: about 40 s on an idle 2-core machine
def test_no_published_policy_nor_ours_beats_the_bound_on_openb(openb: Path) -> None:
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    paper = read_paper(openb / "paper_allocation_ratio.csv")
    workloads = sorted({w for w, _ in paper})
    assert len(workloads) == 13
    for n, workload in enumerate(workloads):
        pods = load_pods(openb / f"{workload}.csv")
        for seed in (42 + n % 10,):  # one seed each, every seed at least once
            fixture = openb / "arrivals" / f"{workload}_seed{seed}.txt.gz"
            arrivals = load_fixture(fixture, pods, nodes)
            found = hindsight(nodes, arrivals.pods, pack=workload.endswith("default"))
            bound = found.bound_column[100]
            assert bound is not None
            published = {
                label: rows[seed][100] for (w, label), rows in paper.items() if w == workload
            }
            assert len(published) == 6 and max(published.values()) <= bound, (workload, seed)
            if found.packing is not None:  # the default workload: ours and the packing too
                offline = found.offline_column[100]
                assert offline is not None and offline <= bound
                spec = simulator_policies()[-1]
                ours = discretise(replay(nodes, arrivals, spec, target_workload(spec, pods), seed))
                assert (ours[100] or 0.0) <= bound and spec.name == "kubegpu"


def test_simulate_bound_prints_both_rows_beside_the_policies(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    out = tmp_path / "out"
    result = simulate(
        "--nodes", str(tmp_path / "nodes.csv"), "--pods", str(pods), "--policy", "fgd,kubegpu",
        "--seeds", "1-2", "--bound", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Upper bound" in result.stdout and "Offline packing" in result.stdout
    with (out / "allocation.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    by_label: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_label.setdefault(row["sc_policy"], []).append(row)
    assert sorted(by_label) == ["06-FGD", "07-Kubegpu", "Offline packing", "Upper bound"]
    for label in ("Offline packing", "Upper bound"):
        assert len(by_label[label]) == 2
        assert all(r["100"] and not r["99"] and not r["101"] for r in by_label[label])
    for seed in ("1", "2"):
        bound = next(float(r["100"]) for r in by_label["Upper bound"] if r["seed"] == seed)
        for label in ("06-FGD", "07-Kubegpu", "Offline packing"):
            value = next(float(r["100"]) for r in by_label[label] if r["seed"] == seed)
            assert value <= bound
    assert (out / "allocation.png").stat().st_size > 10_000


def test_simulate_bound_without_highspy_exits_2_saying_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "highspy.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    import subprocess

    result = subprocess.run(
        [sys.executable, "-m", "kubegpu", "simulate", "--nodes", str(tmp_path / "nodes.csv"),
         "--pods", str(pods), "--seeds", "1", "--bound", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "kubegpu[bound]" in result.stderr and "Traceback" not in result.stderr
