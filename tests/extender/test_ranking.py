"""The engine's choice is kube-scheduler's: /prioritize and /prioritize-dra give the node the
engine would choose (the simulator's: best score, ties to the first name) the one top priority,
with a lead the shipped weight makes larger than kube-scheduler's resource scores can give
(``kubegpu.extender.ranking``); a CPU-only pod is ranked by the policy too. Over real HTTP
against the fake API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from kubegpu.extender.ranking import FOLLOWER_MAX, MAX_EXTENDER_PRIORITY, extender_priorities
from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.policies import get_policy
from kubegpu.sharing.resources import gpu_request
from kubegpu.testing.apiserver import FakeApiServer, make_node, make_pod
from tests.extender.cluster import (
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# kube-scheduler's in-tree scores that prefer the emptier node, at their default weight 1.
RESOURCE_SCORES_MAX = 100 + 100  # NodeResourcesFit (LeastAllocated), BalancedAllocation


def scores(body: list[dict[str, Any]]) -> dict[str, int]:
    return {s["Host"]: s["Score"] for s in body}


def test_only_the_engines_choice_gets_the_top_priority() -> None:
    engine_scores = np.array([100, 100, 40, 0, 99], dtype=np.int64)
    out = extender_priorities(engine_scores, best=1)
    assert out.tolist() == [5, MAX_EXTENDER_PRIORITY, 2, 0, 5]
    assert extender_priorities(np.zeros(0, dtype=np.int64), None).size == 0


@pytest.mark.parametrize(
    "config",
    [
        *sorted(DEPLOY.rglob("*kube-scheduler-config.yaml")),
        *sorted((DEPLOY / "scheduler").glob("*-scheduler.yaml")),
    ],
    ids=lambda p: str(p.relative_to(DEPLOY)),
)
def test_the_shipped_weight_makes_the_lead_outweigh_the_resource_scores(config: Path) -> None:
    extenders = yaml.safe_load(config.read_text())["extenders"]
    assert extenders
    for extender in extenders:
        lead = (MAX_EXTENDER_PRIORITY - FOLLOWER_MAX) * extender["weight"] * 10
        assert lead > RESOURCE_SCORES_MAX, (config, extender["urlPrefix"])


@pytest.mark.parametrize("policy", ["fgd", "kubegpu", "binpack"])
async def test_among_equal_nodes_the_first_by_name_alone_gets_the_top(policy: str) -> None:
    names = ["node-c", "node-a", "node-b"]  # kube-scheduler's order is not the engine's
    async with FakeApiServer() as server:
        for name in names:
            server.store.put("nodes", gpu_node(name, cards=4))
        server.store.put("pods", make_pod("cpu", requests={"cpu": "4", "memory": "1Gi"}))
        async with running_extender(server, policy=policy) as ext, http_session() as http:
            for pod in (shared_pod("s", 8192, 300), whole_pod("w", 2)):
                _, body = await post(http, f"{ext.url}/prioritize", filter_args(pod, names))
                got = scores(body)
                assert got["node-a"] == MAX_EXTENDER_PRIORITY, got
                assert all(got[n] <= FOLLOWER_MAX for n in ("node-b", "node-c")), got


@pytest.mark.parametrize("policy", ["fgd", "kubegpu"])
async def test_the_top_priority_is_the_node_the_simulator_chooses(policy: str) -> None:
    names = ["node-a", "node-b", "node-c"]
    pods = [shared_pod(f"s-{i}", 8192, 500, cpu="4") for i in range(4)]
    pods += [
        whole_pod("w-0", 2, cpu="16"),
        make_pod("cpu-0", requests={"cpu": "24", "memory": "1Gi"}),
    ]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=2, cpu="8"))
        server.store.put("nodes", gpu_node("node-b", cards=4, cpu="64"))
        server.store.put("nodes", gpu_node("node-c", cards=1, cpu="40"))
        for pod in pods:
            server.store.put("pods", pod)
        async with running_extender(server, policy=policy) as ext, http_session() as http:
            incoming = [shared_pod("next", 4096, 300, cpu="2"), whole_pod("next-w", 1)]
            answers = []
            for pod in incoming:
                _, body = await post(http, f"{ext.url}/prioritize", filter_args(pod, names))
                answers.append(scores(body))
            live = ext.scheduler.engine()
            states = [live.node_state(name) for name in live.names]
            workload = ext.scheduler.current_workload()
    offline = PlacementEngine(states, get_policy(policy), workload)
    for pod, got in zip(incoming, answers, strict=True):
        request = gpu_request(pod).to_placement()
        chosen = offline.choose(request)
        assert chosen is not None
        assert [n for n, s in got.items() if s == MAX_EXTENDER_PRIORITY] == [chosen.node], got


@pytest.mark.parametrize("policy", ["fgd", "kubegpu"])
async def test_a_cpu_only_pod_is_ranked_by_the_policy_on_gpu_nodes(policy: str) -> None:
    names = ["node-a", "node-b", "node-c"]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=2, cpu="8"))
        server.store.put("nodes", gpu_node("node-b", cards=8, cpu="96"))
        server.store.put("nodes", gpu_node("node-c", cards=1, cpu="40"))
        server.store.put("pods", shared_pod("s-0", 8192, 500, cpu="4"))
        async with running_extender(server, policy=policy) as ext, http_session() as http:
            pod = make_pod("cpu-pod", requests={"cpu": "6", "memory": "2Gi"})
            status, body = await post(http, f"{ext.url}/prioritize-dra", filter_args(pod, names))
            live = ext.scheduler.engine()
            states = [live.node_state(name) for name in live.names]
            workload = ext.scheduler.current_workload()
    assert status == 200
    got = scores(body)
    chosen = PlacementEngine(states, get_policy(policy), workload).choose(
        gpu_request(pod).to_placement()
    )
    assert chosen is not None
    assert [n for n, s in got.items() if s == MAX_EXTENDER_PRIORITY] == [chosen.node], got
    assert all(s <= FOLLOWER_MAX for n, s in got.items() if n != chosen.node), got


async def test_a_cpu_only_pod_prefers_a_node_without_gpus() -> None:
    names = ["gpu-a", "plain", "gpu-b"]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("gpu-a", cards=2))
        server.store.put("nodes", gpu_node("gpu-b", cards=8))
        server.store.put("nodes", make_node("plain", cpu="32", memory="128Gi"))
        async with running_extender(server, policy="kubegpu") as ext, http_session() as http:
            pod = make_pod("cpu-pod", requests={"cpu": "2", "memory": "1Gi"})
            _, body = await post(http, f"{ext.url}/prioritize-dra", filter_args(pod, names))
            # A GPU pod is not this verb's: it scores 0 everywhere here (no DRA claims).
            _, gpu_body = await post(
                http, f"{ext.url}/prioritize-dra", filter_args(whole_pod("w", 1), names)
            )
    # Ours prices the CPU a pod strands GPUs with: none on a node without GPUs.
    got = scores(body)
    assert got["plain"] == MAX_EXTENDER_PRIORITY, got
    assert got["gpu-a"] <= FOLLOWER_MAX and got["gpu-b"] <= FOLLOWER_MAX, got
    assert scores(gpu_body) == dict.fromkeys(names, 0)
