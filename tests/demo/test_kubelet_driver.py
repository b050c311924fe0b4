"""The kubelet admission driver against a real node agent process in shared mode, the kubelet
emulator (gRPC over unix sockets) and the fake API server (HTTP, lightkube)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import lightkube
import pytest
from lightkube.resources.core_v1 import Pod

from kubegpu.kubelet.resources import card_of
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.node import KubeletDriver, admission_order, device_requests
from kubegpu.testing.waiting import wait_until_async
from tests.kubelet.sharenode import NODE, SLOT, SharedNode, ShareSpec, ready_shared_node

pytestmark = pytest.mark.slow


@pytest.fixture
def node() -> Iterator[SharedNode]:
    with ready_shared_node() as shared:
        yield shared


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    # What the node agent process and the driver have written to the fake API server.
    await wait_until_async(check, timeout_s=timeout_s, what=what, poll_s=0.05)


def status(node: SharedNode, name: str) -> dict[str, Any]:
    pod = node.api.store.get("pods", "default", name)
    return (pod or {}).get("status") or {}


async def test_admits_a_decided_share_fails_an_undecided_one_and_releases_on_delete(
    node: SharedNode,
) -> None:
    client = lightkube.AsyncClient(node.api.kubeconfig(), trust_env=False)
    driver = KubeletDriver(client, NODE, node.kubelet)
    task = asyncio.create_task(driver.run())
    try:
        uid = node.add_shared_pod("decided", 2, [ShareSpec("main", 300, 4000)])
        rogue = node.add_shared_pod("rogue", None, [ShareSpec("main", 100, 1000)], decide=False)
        await eventually(lambda: status(node, "decided").get("phase") == "Running", "Running")
        await eventually(lambda: status(node, "rogue").get("phase") == "Failed", "Failed")

        running = status(node, "decided")
        assert {c["type"] for c in running["conditions"]} >= {"Ready", "PodScheduled"}
        (allocation,) = [a for a in node.kubelet.allocations() if a.pod_uid == uid]
        assert allocation.resource_name == SLOT
        assert card_of(allocation.device_ids[0]) == node.card(2).uuid
        assert allocation.envs["KUBEGPU_GPU_MEMORY_LIMIT_MIB"] == "4000"

        failed = status(node, "rogue")
        assert failed["reason"] == "UnexpectedAdmissionError"
        assert failed["message"].startswith("Pod was rejected: Allocate failed due to ")
        assert "no pending pod has a kubegpu decision" in failed["message"]
        assert not [a for a in node.kubelet.allocations() if a.pod_uid == rogue]

        # The kubelet reports device-plugin resources on its Node.
        def reported() -> bool:
            stored = node.api.store.get("nodes", None, NODE) or {}
            return SLOT in (stored.get("status") or {}).get("allocatable", {})

        await eventually(reported, "allocatable published")

        await client.delete(Pod, "decided", namespace="default")
        await eventually(
            lambda: not [a for a in node.kubelet.allocations() if a.pod_uid == uid], "released"
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def test_containers_are_admitted_init_first_and_pods_oldest_first() -> None:
    names = ResourceNames()
    pod = {
        "metadata": {"name": "p", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "initContainers": [
                {"name": "init", "resources": {"limits": {names.whole_gpu: "1"}}},
                {
                    "name": "proxy",
                    "restartPolicy": "Always",
                    "resources": {"limits": {names.whole_gpu: "1"}},
                },
            ],
            "containers": [
                {"name": "cpu-only", "resources": {"requests": {"cpu": "1"}}},
                {"name": "app", "resources": {"limits": {names.whole_gpu: "2"}}},
            ],
        },
    }
    assert device_requests(pod, names) == [
        ("init", "init", names.whole_gpu, 1),
        ("proxy", "sidecar", names.whole_gpu, 1),
        ("app", "app", names.whole_gpu, 2),
    ]
    older = {"metadata": {"uid": "z", "creationTimestamp": "2025-12-31T23:59:59Z"}}
    assert sorted([pod, older], key=admission_order)[0] is older
