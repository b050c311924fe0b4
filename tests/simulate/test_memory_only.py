"""The memory-only variants of a trace (kubegpu.simulate.memory_only) and
``kubegpu simulate --memory-only``: shares re-expressed as memory alone, counted by what they
hold."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.simulate.memory_only import (
    MEMORY_ONLY_COMPUTE_MILLI,
    MODEL_MEMORY_MIB,
    UnknownModel,
    memory_only,
    with_card_memory,
)
from tests.simulate.test_command import NODES, simulate, write_pods


def cluster() -> list[NodeState]:
    return with_card_memory(
        [
            NodeState("t4", 32000, 32000, 1 << 17, "T4", (GpuState(0), GpuState(1))),
            NodeState("g2-a", 64000, 64000, 1 << 18, "G2", tuple(GpuState(i) for i in range(8))),
            NodeState("g2-b", 64000, 64000, 1 << 18, "G2", tuple(GpuState(i) for i in range(8))),
        ]
    )


def test_cards_get_their_models_memory_and_an_unknown_model_is_named() -> None:
    nodes = cluster()
    assert {g.memory_mib for g in nodes[0].gpus} == {MODEL_MEMORY_MIB["T4"]}
    assert all(g.free_memory_mib == g.memory_mib for n in nodes for g in n.gpus)
    with pytest.raises(UnknownModel, match=r"node x: card model 'H9' has no known memory"):
        with_card_memory([NodeState("x", 1000, 1000, 1000, "H9", (GpuState(0),))])


def test_openb_variant_asks_the_share_fraction_of_the_most_common_card_it_may_use() -> None:
    nodes = cluster()
    pods = [
        PodRequest(1000, 1024, 1, 250, name="share"),
        PodRequest(1000, 1024, 1, 500, gpu_models=frozenset({"T4"}), name="t4-only"),
        PodRequest(1000, 1024, 2, 1000, name="pair"),
        PodRequest(1000, 1024, name="cpu"),
    ]
    share, t4_only, pair, cpu = memory_only(pods, nodes, "openb", 42)
    assert (share.gpu_milli, share.gpu_memory_mib) == (MEMORY_ONLY_COMPUTE_MILLI, 32768 // 4)
    assert t4_only.gpu_memory_mib == MODEL_MEMORY_MIB["T4"] // 2
    assert (pair, cpu) == (pods[2], pods[3])
    # Counted at its level on the most common card: the trace's 250 milli again.
    assert share.card_milli(32768) == 250


def test_gpushare_variant_draws_whole_gib_fixed_by_seed_and_name() -> None:
    nodes = cluster()
    pods = [PodRequest(1000, 1024, 1, 100, name=f"p{i}") for i in range(200)]
    first = memory_only(pods, nodes, "gpushare", 42)
    assert first == memory_only(pods, nodes, "gpushare", 42)
    sizes = {p.gpu_memory_mib for p in first}
    assert all(s is not None and s % 1024 == 0 and 1024 <= s <= 32768 for s in sizes)
    assert len(sizes) > 20  # drawn, not one size
    assert memory_only(pods, nodes, "gpushare", 43) != first
    with pytest.raises(ValueError, match="memory-only variant 'x'"):
        memory_only(pods, nodes, "x", 42)


def test_simulate_memory_only_replays_and_names_the_variant(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    out = tmp_path / "out"
    done = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit,kubegpu",
        "--seeds", "42", "--memory-only", "openb", "--out", str(out), "--no-plot",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with (out / "allocation.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["workload"] for r in rows} == {"tiny-memory-openb"}
    assert all(max(float(r[str(c)] or 0) for c in range(131)) > 0 for r in rows)


def test_simulate_memory_only_refuses_bound_and_an_unknown_model(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    out = tmp_path / "out"
    done = simulate(
        "--nodes", str(nodes), "--pods", str(pods), "--memory-only", "openb", "--mig",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 2 and "cannot be combined with --mig" in done.stderr
    odd = tmp_path / "odd.csv"
    odd.write_text("sn,cpu_milli,memory_mib,gpu,model\nn-0,32000,131072,2,H9\n")
    done = simulate(
        "--nodes", str(odd), "--pods", str(pods), "--memory-only", "gpushare", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 2 and "card model 'H9' has no known memory" in done.stderr
