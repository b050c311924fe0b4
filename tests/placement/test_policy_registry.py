"""The policy registry is the one list of policies: a toy registered there (one module, one
entry: ``tests/placement/leastloaded.py``) is placed with by the engine, accepted and run by
the extender, listed and run by ``kubegpu simulate`` and listed by the CLI's help, with no
other file touched; and what the registry says of each policy is what its users do."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubegpu.config.extender import ExtenderConfig, ExtenderConfigError
from kubegpu.demo.command import _known_policy
from kubegpu.placement.device_order import CardChoice, DeviceOrderEngine, check_steerable
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.fragmentation import TypicalWorkload
from kubegpu.placement.model import GpuState, NodeState, PodRequest
from kubegpu.placement.policies import (
    POLICIES,
    extender_names,
    extender_policy,
    get_policy,
    simulator_policies,
)
from kubegpu.simulate.command import Job, parse_policies, run_job
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import (
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
)
from tests.placement.leastloaded import LEASTLOADED, registered
from tests.simulate.test_command import NODES, write_pods

REPO = Path(__file__).resolve().parents[2]
CHART_SCHEMA = REPO / "deploy" / "helm" / "kubegpu" / "values.schema.json"


def node(name: str, free: list[int], rank: int) -> NodeState:
    gpus = tuple(GpuState(i, milli) for i, milli in enumerate(free))
    return NodeState(name, 64000, 64000, 262144, "T4", gpus, rank=rank)


# "a": two cards, one half used (3/4 of its GPU free); "b": eight idle cards. BestFit packs a
# share onto a's half-used card; the toy takes the least loaded node, b.
NODES_A_B = [node("a", [1000, 500], 0), node("b", [1000] * 8, 1)]
SHARE = PodRequest(1000, 1024, 1, 300, name="share")


def test_the_engine_places_with_a_registered_toy_policy() -> None:
    with pytest.raises(KeyError, match="unknown policy 'leastloaded'"):
        PlacementEngine(NODES_A_B, "leastloaded")
    with registered():
        assert get_policy("LeastLoaded") is LEASTLOADED
        toy = PlacementEngine(NODES_A_B, "leastloaded").place(SHARE)
        dra = DeviceOrderEngine(NODES_A_B, LEASTLOADED, card_choice=CardChoice.STEERED)
        assert dra.place(SHARE) == toy
    assert toy is not None and (toy.node, toy.gpu_indices, toy.score) == ("b", (0,), 100)
    packed = PlacementEngine(NODES_A_B, "bestfit").place(SHARE)
    assert packed is not None and (packed.node, packed.gpu_indices) == ("a", (1,))


def test_the_extender_settings_and_the_demo_accept_a_registered_toy_policy() -> None:
    with pytest.raises(ExtenderConfigError, match="policy 'leastloaded' unknown"):
        ExtenderConfig(policy="leastloaded").validate()
    with registered():
        ExtenderConfig(policy="leastloaded").validate()
        assert _known_policy("leastloaded") == "leastloaded"
        assert extender_policy("LEASTLOADED") is LEASTLOADED
        assert "leastloaded" in extender_names()


async def test_the_extender_prioritizes_by_a_registered_toy_policy() -> None:
    # node-b holds a 500-milli share on one of its two cards: BestFit (binpack) prefers it,
    # the toy prefers the idle node-a.
    with registered():
        async with FakeApiServer() as server:
            server.store.put("nodes", gpu_node("node-a", cards=2))
            server.store.put("nodes", gpu_node("node-b", cards=2))
            server.store.put("pods", shared_pod("busy", 40960, 500))
            uid = server.store.get("pods", "default", "busy")["metadata"]["uid"]
            async with (
                running_extender(server, policy="leastloaded") as ext,
                http_session() as http,
            ):
                assert ext.scheduler.engine_policy is LEASTLOADED
                bind = {"PodName": "busy", "PodNamespace": "default", "PodUID": uid}
                _, bound = await post(http, f"{ext.url}/bind", {**bind, "Node": "node-b"})
                assert bound == {"Error": ""}
                args = filter_args(shared_pod("next", 8192, 200), ["node-a", "node-b"])
                status, body = await post(http, f"{ext.url}/prioritize", args)
    assert status == 200
    scores = {entry["Host"]: entry["Score"] for entry in body}
    assert scores["node-a"] > scores["node-b"]


def test_the_simulator_runs_a_registered_toy_policy(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    with registered():
        assert [p.name for p in parse_policies("all")][-1] == "leastloaded"
        result = run_job(Job(nodes, pods, None, "leastloaded", 1, 1.3))
        assert result.job.label == "LeastLoaded"  # allocation.csv's sc_policy
    assert result.total_gpus == 18
    assert max(ratio for ratio in result.columns if ratio is not None) > 50.0  # it placed pods


def kubegpu_with_toy(*args: str) -> subprocess.CompletedProcess[str]:
    """``kubegpu ARGS`` in a fresh process with the toy registered before any command loads."""
    return subprocess.run(
        [sys.executable, "-m", "tests.placement.leastloaded", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def words(text: str) -> str:
    """Help text unwrapped: a list may break across lines anywhere."""
    return " ".join(text.split())


def test_the_cli_lists_and_accepts_a_registered_toy_policy(tmp_path: Path) -> None:
    extender_help = kubegpu_with_toy("extender", "--help")
    assert extender_help.returncode == 0, extender_help.stderr
    assert "binpack, fgd, kubegpu, leastloaded or spread" in words(extender_help.stdout)
    simulate_help = kubegpu_with_toy("simulate", "--help")
    assert "bestfit, fgd, kubegpu, leastloaded, or 'all'" in words(simulate_help.stdout)
    # The policy is accepted: what stops the extender is the next setting it checks.
    extender = kubegpu_with_toy("extender", "--policy", "leastloaded")
    assert extender.returncode == 2 and "leader-lease is not set" in extender.stderr
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES)
    pods = write_pods(tmp_path / "tiny.csv")
    out = tmp_path / "out"
    simulate = kubegpu_with_toy(
        "simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "leastloaded",
        "--seeds", "1", "--out", str(out), "--no-plot",
    )  # fmt: skip
    assert simulate.returncode == 0, simulate.stderr
    with (out / "allocation.csv").open() as handle:
        assert [row[1] for row in csv.reader(handle)][1:] == ["LeastLoaded"]


# ----------------------------------------------------------------- what the table says is done


def test_a_policy_that_needs_a_workload_is_refused_without_one_and_the_others_are_not() -> None:
    nodes = [node("a", [1000, 500], 0)]
    workload = TypicalWorkload.from_pods([SHARE])
    for spec in POLICIES.values():
        if spec.needs_workload:
            with pytest.raises(ValueError, match="needs a target workload"):
                PlacementEngine(nodes, spec)
        else:
            assert PlacementEngine(nodes, spec).place(SHARE) is not None
        assert PlacementEngine(nodes, spec, workload).place(SHARE) is not None


def test_steering_is_offered_for_exactly_the_policies_whose_card_rule_a_driver_can_publish() -> (
    None
):
    steerable = []
    for spec in POLICIES.values():
        try:
            check_steerable(spec)
        except ValueError:
            continue
        steerable.append(spec.name)
    assert steerable == ["dotprod", "gpuclustering", "gpupacking", "bestfit", "kubegpu", "spread"]


def test_the_simulator_runs_the_paper_grid_and_the_extender_lists_its_four() -> None:
    assert [p.label for p in simulator_policies()] == [
        "01-Random", "02-DotProd", "03-GpuClustering", "04-GpuPacking", "05-BestFit", "06-FGD",
        "07-Kubegpu",
    ]  # fmt: skip
    assert extender_names() == ["binpack", "fgd", "kubegpu", "spread"]
    assert extender_policy("binpack") is POLICIES["bestfit"]


def test_the_chart_offers_the_policies_the_extender_lists() -> None:
    schema = json.loads(CHART_SCHEMA.read_text())
    offered = schema["properties"]["extender"]["properties"]["policy"]["enum"]
    assert sorted(offered) == sorted(extender_names())
