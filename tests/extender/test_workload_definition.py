"""The extender and the simulator measure against the same target workload, built by one rule
from the same pods (every pod, CPU-only ones included), and so place a pod alike on the same
cluster state: checked over real HTTP against the fake API server."""

from __future__ import annotations

import pytest

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.policies import get_policy
from kubegpu.sharing.resources import gpu_request
from kubegpu.simulate.replay import target_workload
from kubegpu.testing.apiserver import FakeApiServer, make_pod
from tests.extender.cluster import (
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)


def pending_pods() -> list[dict[str, object]]:
    pods = [shared_pod(f"s5-{i}", 8192, 500, cpu="4") for i in range(6)]
    pods += [shared_pod(f"s3-{i}", 4096, 300, cpu="2") for i in range(3)]
    pods += [whole_pod(f"w2-{i}", 2, cpu="16") for i in range(2)]
    # CPU-only pods: FGD's workload has them, and they change its scores (XL/XR).
    pods += [make_pod(f"cpu-{i}", requests={"cpu": "24", "memory": "1Gi"}) for i in range(5)]
    return pods  # type: ignore[return-value]


@pytest.mark.parametrize("policy", ["fgd", "kubegpu"])
async def test_extender_and_simulator_build_one_workload_and_choose_one_node(
    policy: str,
) -> None:
    pods = pending_pods()
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=2, cpu="8"))
        server.store.put("nodes", gpu_node("node-b", cards=4, cpu="64"))
        server.store.put("nodes", gpu_node("node-c", cards=1, cpu="40"))
        for pod in pods:
            server.store.put("pods", pod)
        # running_extender returns once the first listing (these nodes and pods) is in.
        async with running_extender(server, policy=policy) as ext, http_session() as http:
            incoming = shared_pod("next", 4096, 300, cpu="2")
            _, scores = await post(
                http, f"{ext.url}/prioritize", filter_args(incoming, ["node-a", "node-b", "node-c"])
            )
            live = ext.scheduler.engine()
            states = [live.node_state(name) for name in live.names]
            live_workload = ext.scheduler.current_workload()
    spec = get_policy(policy)
    requests = [gpu_request(p).to_placement() for p in pods]
    assert live_workload == target_workload(spec, requests)
    assert any(t.gpu_count == 0 for t in live_workload.pods)
    # The simulator's path: an engine over the same node states, the workload from the pods.
    offline = PlacementEngine(states, spec, target_workload(spec, requests))
    chosen = offline.choose(gpu_request(incoming).to_placement())
    assert chosen is not None
    best = max(s["Score"] for s in scores)
    assert chosen.node in {s["Host"] for s in scores if s["Score"] == best}
