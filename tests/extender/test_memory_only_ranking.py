"""Aliyun-style pods (GPU memory alone, 1 milli of compute) are ranked by the memory they hold,
through the real extender over HTTP (issue 32: with ``--policy binpack`` every decision had
one flat score, and the pods spread like the peer's)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from kubegpu.sharing.peers import admission_patch, peer_compat
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer, make_pod
from kubegpu.webhook.review import apply_patch
from tests.extender.cluster import SLOT, filter_args, gpu_node, post, running_extender

NAMES = ResourceNames(peers=peer_compat(["aliyun"]))
NODES = ["node-a", "node-b", "node-c"]


def aliyun_pod(name: str, gib: int) -> dict[str, Any]:
    pod = make_pod(
        name, "default", requests={"cpu": "100m"}, limits={"aliyun.com/gpu-mem": str(gib)}
    )
    return apply_patch(pod, admission_patch(pod, NAMES.peers, SLOT))


@pytest.mark.parametrize("policy", ["binpack", "kubegpu", "fgd"])
async def test_memory_only_pods_go_to_the_card_their_memory_packs(policy: str) -> None:
    # node-a is empty, node-b's card has 20 GiB held, node-c's 64 GiB: 16 GiB left.
    held = {"node-b": [20], "node-c": [32, 32]}
    async with FakeApiServer() as server:
        for name in NODES:
            server.store.put("nodes", gpu_node(name, cards=1))
        pods = {
            f"{node}-{k}": (node, aliyun_pod(f"{node}-{k}", gib))
            for node, sizes in held.items()
            for k, gib in enumerate(sizes)
        }
        incoming = aliyun_pod("incoming", 16)
        for _, pod in pods.values():
            server.store.put("pods", pod)
        server.store.put("pods", incoming)
        async with (
            running_extender(server, policy=policy, names=NAMES) as ext,
            aiohttp.ClientSession() as http,
        ):
            for name, (node, _) in pods.items():
                uid = server.store.get("pods", "default", name)["metadata"]["uid"]  # type: ignore[index]
                status, body = await post(http, f"{ext.url}/bind", {
                        "PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node,
                    })  # fmt: skip
                assert (status, body["Error"]) == (200, ""), body
            status, scores = await post(http, f"{ext.url}/prioritize", filter_args(incoming, NODES))
    assert status == 200
    by_node = {s["Host"]: s["Score"] for s in scores}
    # 16 GiB fills node-c's card exactly: every packing policy sends it there. Ranked by the
    # pods' 1 milli of compute, the nodes tied and the first in rank order, node-a, won.
    assert max(by_node, key=lambda n: (by_node[n], -NODES.index(n))) == "node-c"
    assert len(set(by_node.values())) > 1
