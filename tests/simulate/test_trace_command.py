"""``kubegpu trace constrain`` / ``arrivals`` as real processes, and the pure rule beneath."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.simulate.arrivals import generate_arrivals, load_fixture
from kubegpu.simulate.constrain import choose_constraints, model_weights
from kubegpu.simulate.traces import TracePod, load_nodes, load_pods

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,32000,131072,2,T4
n-1,32000,131072,4,T4
n-2,64000,262144,8,V100M32
n-3,64000,262144,8,G2
n-4,64000,262144,8,G2
n-5,64000,262144,8,G2
n-6,64000,262144,8,G2
"""
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"


def write_trace(tmp_path: Path, count: int = 400) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    shapes = [(4000, 8192, 1, 500), (8000, 8192, 1, 1000), (32000, 8192, 8, 1000), (1000, 1, 0, 0)]
    rows = [
        f"p-{i:04d},{c},{m},{n},{g},,LS\n" for i, (c, m, n, g) in enumerate(shapes * (count // 4))
    ]
    pods = tmp_path / "pods.csv"
    pods.write_text(HEADER + "".join(rows))
    return nodes, pods


def kubegpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def pod(name: str, count: int, milli: int, cpu: int = 1000, models: str = "") -> TracePod:
    request = PodRequest(
        cpu, 1024, count, milli, gpu_models=frozenset(m for m in models.split("|") if m)
    )
    return TracePod(name, request, models)


def test_model_weights_over_represent_scarce_models() -> None:
    nodes = [
        NodeState("a", 1, 1, 1, "G2", tuple(GpuState(i) for i in range(100))),
        NodeState("b", 1, 1, 1, "T4", tuple(GpuState(i) for i in range(4))),
    ]
    # 100 G2 cards against 4 T4: drawn 10 : 2, i.e. T4 at 1/6 instead of 4/104 of cards.
    assert model_weights(nodes) == {"G2": 10.0, "T4": 2.0}


def test_constrains_the_asked_fraction_of_unconstrained_gpu_pods_only(tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    pods = load_pods(pods_csv)
    pods.append(pod("already", 1, 500, models="T4"))
    specs = choose_constraints(pods, load_nodes(nodes_csv), 0.25, seed=7)
    gpu_pods = [p for p in pods if p.request.gpu_count and not p.request.gpu_models]
    assert len(specs) == round(0.25 * len(gpu_pods)) == 75
    assert "already" not in specs
    cpu_only = {p.name for p in pods if not p.request.gpu_count}
    assert not cpu_only & set(specs)


def test_every_model_set_can_hold_its_pod_and_sets_vary_in_size_and_spelling(
    tmp_path: Path,
) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path, count=2000)
    pods = {p.name: p for p in load_pods(pods_csv)}
    specs = choose_constraints(list(pods.values()), load_nodes(nodes_csv), 1.0, seed=3)
    sizes = Counter(len(set(s.split("|"))) for s in specs.values())
    assert sizes[1] > sizes[2] > 0 and sizes[3] > 0
    # 8-card pods fit only the 8-card V100M32 and G2 nodes, never T4 (at most 4 per node).
    for name, spec in specs.items():
        if pods[name].request.gpu_count == 8:
            assert set(spec.split("|")) <= {"V100M32", "G2"}, spec
    repeated = [s for s in specs.values() if len(s.split("|")) != len(set(s.split("|")))]
    assert repeated, "some sets repeat a token"
    assert "G2|T4" in specs.values() and "T4|G2" in specs.values()


def test_the_same_seed_gives_the_same_variant_and_another_seed_another(tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    pods, nodes = load_pods(pods_csv), load_nodes(nodes_csv)
    first = choose_constraints(pods, nodes, 0.3, seed=11)
    assert choose_constraints(pods, nodes, 0.3, seed=11) == first
    assert choose_constraints(pods, nodes, 0.3, seed=12) != first


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_pure_rule_rejects_a_fraction_outside_0_1(fraction: float, tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    with pytest.raises(ValueError, match="fraction must be in"):
        choose_constraints(load_pods(pods_csv), load_nodes(nodes_csv), fraction, seed=1)


def test_cli_writes_a_variant_simulate_reads_keeping_the_other_columns(tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    out = tmp_path / "variant" / "pods_c20.csv"
    result = kubegpu(
        "trace", "constrain", "--nodes", str(nodes_csv), "--pods", str(pods_csv),
        "--fraction", "0.2", "--seed", "5", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "60 of 300 GPU pods constrained" in result.stdout
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["qos"] for r in rows} == {"LS"}
    variant = load_pods(out)
    assert sum(1 for p in variant if p.request.gpu_models) == 60
    assert {p.name for p in variant} == {p.name for p in load_pods(pods_csv)}


def test_cli_adds_the_gpu_spec_column_when_the_trace_has_none(tmp_path: Path) -> None:
    nodes_csv, _ = write_trace(tmp_path)
    pods_csv = tmp_path / "multigpu.csv"
    pods_csv.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"m-{i},8000,1024,2,1000\n" for i in range(10))
    )
    out = tmp_path / "out.csv"
    result = kubegpu(
        "trace", "constrain", "--nodes", str(nodes_csv), "--pods", str(pods_csv),
        "--fraction", "1", "--seed", "0", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert out.read_text().splitlines()[0] == "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
    assert all(p.request.gpu_models for p in load_pods(out))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fraction", "0"], "Invalid value for '--fraction': 0.0 is not in the range"),
        (["--fraction", "1.01"], "Invalid value for '--fraction'"),
        (["--fraction", "half"], "Invalid value for '--fraction'"),
        (["--fraction", "0.5", "--seed", "-1"], "Invalid value for '--seed'"),
    ],
)
def test_cli_rejects_bad_options_with_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    base = ["trace", "constrain", "--nodes", str(nodes_csv), "--pods", str(pods_csv)]
    if "--seed" not in args:
        args = [*args, "--seed", "1"]
    result = kubegpu(*base, *args, "--out", str(tmp_path / "o.csv"))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_reports_a_bad_trace_cell_with_exit_2(tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    pods_csv.write_text(pods_csv.read_text().replace("p-0001,8000", "p-0001,lots"))
    result = kubegpu(
        "trace", "constrain", "--nodes", str(nodes_csv), "--pods", str(pods_csv),
        "--fraction", "0.5", "--seed", "1", "--out", str(tmp_path / "o.csv"),
    )  # fmt: skip
    assert result.returncode == 2
    assert f"{pods_csv}:3: column 'cpu_milli': not an integer: 'lots'" in result.stderr
    assert "Traceback" not in result.stderr


def test_arrival_fixtures_round_trip_and_drive_simulate(tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    fixtures = tmp_path / "arrivals"
    result = kubegpu(
        "trace", "arrivals", "--nodes", str(nodes_csv), "--pods", str(pods_csv),
        "--seeds", "42-43", "--out", str(fixtures),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    nodes, pods = load_nodes(nodes_csv), load_pods(pods_csv)
    for seed in (42, 43):
        loaded = load_fixture(fixtures / f"pods_seed{seed}.txt.gz", pods, nodes)
        assert loaded == generate_arrivals(pods, nodes, seed, 1.3)
    out = tmp_path / "sim"
    result = kubegpu(
        "simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "fgd",
        "--seeds", "42-43", "--arrivals", str(fixtures), "--out", str(out), "--no-plot",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (out / "allocation.csv").is_file()


def test_cli_names_the_seeds_option_when_a_seed_is_bad(tmp_path: Path) -> None:
    nodes_csv, pods_csv = write_trace(tmp_path)
    result = kubegpu(
        "trace", "arrivals", "--nodes", str(nodes_csv), "--pods", str(pods_csv),
        "--seeds", "42-x", "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert result.returncode == 2
    assert "Invalid value for --seeds: not a seed or range: '42-x'" in result.stderr
