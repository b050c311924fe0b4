"""The paper's published curves, reproduced from its traces and arrival fixtures.

A few (workload, policy, seed) cases across the trace families; the full 13 × 6 × 10 grid is
``bench/simulate_grid.py`` (figures in docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kubegpu.placement.fragmentation import spec_models
from kubegpu.placement.policies import get_policy
from kubegpu.simulate.arrivals import load_fixture
from kubegpu.simulate.command import read_paper
from kubegpu.simulate.replay import discretise, replay, target_workload
from kubegpu.simulate.traces import load_nodes, load_pods


def run(openb: Path, workload: str, policy: str, seed: int) -> list[float | None]:
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = load_pods(openb / f"openb_pod_list_{workload}.csv")
    fixture = openb / "arrivals" / f"openb_pod_list_{workload}_seed{seed}.txt.gz"
    arrivals = load_fixture(fixture, pods, nodes)
    spec = get_policy(policy)
    workload_ = target_workload(spec, pods)
    return discretise(replay(nodes, arrivals, spec, workload_, seed))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "policy", "seed"),
    [
        ("default", "fgd", 42),
        ("default", "bestfit", 43),
        ("gpushare100", "fgd", 44),
        ("multigpu50", "gpupacking", 45),
        ("cpu250", "dotprod", 46),
        ("multigpu30", "gpuclustering", 47),
    ],
)
def test_published_columns_are_reproduced_exactly(
    openb: Path, workload: str, policy: str, seed: int
) -> None:
    paper = read_paper(openb / "paper_allocation_ratio.csv")
    published = paper[(f"openb_pod_list_{workload}", get_policy(policy).label)][seed]
    assert run(openb, workload, policy, seed) == published


# Whole-trace replays (ten seeds here, two policies on a constrained trace there): 25-40 s on
# a loaded two-core machine, too close to the suite's 60 s.
@pytest.mark.timeout(180)
@pytest.mark.slow
def test_random_is_within_half_a_point_of_the_published_mean_over_ten_seeds(openb: Path) -> None:
    paper = read_paper(openb / "paper_allocation_ratio.csv")
    published = paper[("openb_pod_list_default", "01-Random")]
    ours = [run(openb, "default", "random", seed)[100] for seed in range(42, 52)]
    theirs = [published[seed][100] for seed in range(42, 52)]
    assert abs(sum(ours) / 10 - sum(theirs) / 10) <= 0.5  # type: ignore[operator]


@pytest.mark.slow
def test_cli_with_fixtures_reports_the_row_as_exact(openb: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "simulate",
            "--nodes",
            str(openb / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(openb / "openb_pod_list_multigpu50.csv"),
            "--policy",
            "bestfit",
            "--seeds",
            "42",
            "--arrivals",
            str(openb / "arrivals"),
            "--paper",
            str(openb / "paper_allocation_ratio.csv"),
            "--out",
            str(tmp_path),
            "--no-plot",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "05-BestFit" in line)
    assert "1/1" in row and "+0.00" in row


def test_cli_without_a_fixture_for_a_seed_exits_2(openb: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu",
            "simulate",
            "--nodes",
            str(openb / "openb_node_list_gpu_node.csv"),
            "--pods",
            str(openb / "openb_pod_list_default.csv"),
            "--seeds",
            "7",
            "--arrivals",
            str(openb / "arrivals"),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "openb_pod_list_default_seed7.txt.gz: no arrival fixture for seed 7" in result.stderr


# Whole-trace replays (ten seeds here, two policies on a constrained trace there): 25-40 s on
# a loaded two-core machine, too close to the suite's 60 s.
@pytest.mark.timeout(180)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "seed"), [("default", 42), ("gpushare100", 43), ("cpu200", 44)]
)
def test_kubegpu_allocates_at_least_half_a_point_more_than_published_fgd(
    openb: Path, workload: str, seed: int
) -> None:
    # Issue 3's target is on the mean of ten seeds per workload (bench/simulate_grid.py,
    # docs/benchmarks.md); single seeds of these three lead by 0.8-1.4 pp there.
    paper = read_paper(openb / "paper_allocation_ratio.csv")
    fgd = paper[(f"openb_pod_list_{workload}", "06-FGD")][seed][100]
    ours = run(openb, workload, "kubegpu", seed)[100]
    assert ours is not None and ours >= fgd + 0.5


# Whole-trace replays (ten seeds here, two policies on a constrained trace there): 25-40 s on
# a loaded two-core machine, too close to the suite's 60 s.
@pytest.mark.timeout(180)
@pytest.mark.slow
def test_kubegpu_leads_fgd_on_a_model_constrained_variant_of_default(
    openb: Path, tmp_path: Path
) -> None:
    # 25 % of default's GPU pods limited to GPU models (kubegpu trace constrain --seed 14),
    # arrivals from our seeded RNG: FGD refuses limited pods while G2 cards wait; ours keeps
    # the scarce models for them (docs/benchmarks.md: +3.7 pp over 10 seeds, worst +3.3).
    from kubegpu.simulate.arrivals import generate_arrivals
    from kubegpu.simulate.constrain import choose_constraints
    from kubegpu.simulate.traces import TracePod

    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")
    pods = load_pods(openb / "openb_pod_list_default.csv")
    specs = choose_constraints(pods, nodes, 0.25, seed=14)
    variant = [
        TracePod(p.name, replace(p.request, gpu_models=spec_models(specs[p.name])), specs[p.name])
        if p.name in specs
        else p
        for p in pods
    ]
    arrivals = generate_arrivals(variant, nodes, 42, 1.3)
    column = {}
    for policy in ("fgd", "kubegpu"):
        spec = get_policy(policy)
        result = replay(nodes, arrivals, spec, target_workload(spec, variant), 42)
        column[policy] = discretise(result)[100]
    assert column["kubegpu"] >= column["fgd"] + 1.0  # type: ignore[operator]
