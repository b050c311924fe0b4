"""The replay at small scale on the real control plane (the CI version of the 1,213-node
benchmark, `e2e/run --bench-scale`): 100 KWOK nodes made by kubegpu's own node-agent code, the
pods of a generated trace created one at a time in arrival order until 100 % of the GPUs have
arrived, through the real kube-scheduler with the kubegpu extender, once with policy `fgd` and
once with `kubegpu`. The allocation ratio read back from the API server's bound pods must agree
with `kubegpu simulate`'s on the same pods, order and tie-break to within 0.3 pp, and no card
may hold more than it has. Runs on its own control plane (no kubelet), after the DRA module."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import _results, started_scale_cluster
from kubegpu_e2e.scale import replay, trace
from kubegpu_e2e.scale.session import PolicyRun, ScaleCluster

from kubegpu.sharing.resources import parse_quantity

E2E = Path(__file__).resolve().parents[1]
SEED = 42
AGREEMENT_PP = 0.3
# One of the extender's reasons, given by at least two nodes ("37 node(s) have ...").
COUNTED_REASON = re.compile(r"(?:^|[:,] )(?:[2-9]|[1-9][0-9]+) node\(s\) have ")


@pytest.fixture(scope="module")
def scale(small_trace: trace.ReplayTrace) -> Iterator[ScaleCluster]:
    yield from started_scale_cluster(ScaleCluster, "scale", "scale cluster start", small_trace)


def test_kwok_nodes_carry_what_the_node_agent_publishes(
    scale: ScaleCluster, small_trace: trace.ReplayTrace
) -> None:
    from kubegpu.kube.inventory import read_node_inventory

    nodes = {n["metadata"]["name"]: n for n in scale.cluster.get("nodes")["items"]}
    assert set(nodes) == {n.name for n in small_trace.nodes}
    for state in small_trace.nodes:
        node = nodes[state.name]
        inventory = read_node_inventory(node)
        assert inventory is not None
        assert [g.index for g in inventory.gpus] == [g.index for g in state.gpus]
        assert {g.model for g in inventory.gpus} == {state.gpu_model}
        capacity = node["status"]["allocatable"]
        assert capacity["nvidia.com/gpu"] == str(len(state.gpus))
        # 32 share slots per card: the shipped node-agent config's slotsPerCard.
        assert capacity["kubegpu.io/gpu-shared"] == str(32 * len(state.gpus))
        assert parse_quantity(capacity["cpu"]) * 1000 == state.cpu_capacity_milli
        assert not node["spec"].get("taints")


@pytest.mark.parametrize("policy", ["fgd", "kubegpu"])
def test_the_real_scheduler_allocates_what_the_simulator_does(
    scale: ScaleCluster, small_trace: trace.ReplayTrace, policy: str
) -> None:
    run: PolicyRun = asyncio.run(scale.run_policy(small_trace, policy, SEED))
    summary = run.summary()
    _results.setdefault(f"scale replay {policy}", {}).update(summary)
    assert run.overcommit == []
    assert summary["late_binds"] == 0, run.outcome.late_binds[:5]
    assert summary["bound"] + summary["refused"] == len(small_trace.pods)
    assert abs(run.real_ratio - run.simulated_ratio) <= AGREEMENT_PP, summary
    # Every GPU pod was bound by the extender, and no bind was refused: one pod at a time,
    # no decision can go stale.
    binds = run.extender_metrics
    assert binds.get('kubegpu_extender_binds_total{result="bound"}') == summary[
        "bound"
    ] - _cpu_only_bound(run, small_trace), binds
    assert [k for k in binds if "binds_total" in k and 'result="bound"' not in k] == [], binds
    # kube-scheduler counts identical reasons into one entry of the refusal message. The
    # extender's reasons name the check and the pod's ask, never the node, so the message
    # stays a few entries long whatever the cluster's size (one entry per node made it 6.5 KB
    # at these 100 nodes).
    refused = [p for p in run.outcome.pods if p.result == replay.REFUSED and p.gpu_milli]
    assert refused and all(p.message for p in refused), refused[:3]
    assert max(len(p.message) for p in refused) < 1500, max(refused, key=lambda p: len(p.message))
    assert any(COUNTED_REASON.search(p.message) for p in refused), [p.message for p in refused[:3]]


def _cpu_only_bound(run: PolicyRun, t: trace.ReplayTrace) -> int:
    cpu_only = {p.name for p in t.pods if p.gpu_count == 0}
    return sum(1 for p in run.outcome.pods if p.name in cpu_only and p.result == "bound")


def test_the_replay_survives_a_killed_leader_and_an_api_server_restart(
    scale: ScaleCluster, small_trace: trace.ReplayTrace
) -> None:
    result = asyncio.run(scale.run_with_faults(small_trace, "kubegpu", SEED))
    _results.setdefault("scale replay with faults", {}).update(result)
    faults = result["faults"]
    assert faults["leader_killed"] != faults["new_leader"], faults
    assert "leader_kill_recovered_s" in faults and "apiserver_restart_recovered_s" in faults
    assert result["overcommitted"] == [] and result["decisions_on_another_node"] == []
    assert result["late_binds"] == 0
    assert result["bound"] + result["refused"] == len(small_trace.pods)
    # The new leader's extender rebuilt the same state from the API server: the same choices.
    assert abs(result["difference_pp"]) <= AGREEMENT_PP, result
