"""Mixed clusters: Volcano-style, Aliyun-style and kubegpu-style pods bound at once onto the same
cards through the real extender (compat modes on) and the fake API server never over-commit a
card, audited from the pods' annotations; every refusal says why."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp

from kubegpu.sharing.claim import read_claim
from kubegpu.sharing.peers import admission_patch, peer_compat
from kubegpu.sharing.resources import ResourceNames
from kubegpu.testing.apiserver import FakeApiServer, make_pod
from kubegpu.webhook.review import apply_patch
from tests.extender.cluster import SLOT, filter_args, gpu_node, post, running_extender, shared_pod
from tests.extender.test_concurrency import audit

NAMES = ResourceNames(peers=peer_compat(["volcano", "aliyun"]))
CARD_MIB = 16384


def peer_pod(name: str, resource: str, amount: int) -> dict[str, Any]:
    pod = make_pod(name, "default", requests={"cpu": "100m"}, limits={resource: str(amount)})
    return apply_patch(pod, admission_patch(pod, NAMES.peers, SLOT))


def mixed_pods(rng: random.Random) -> list[dict[str, Any]]:
    pods = []
    for i in range(60):
        kind = i % 3
        if kind == 0:
            pods.append(peer_pod(f"volcano-{i}", "volcano.sh/gpu-memory", rng.choice([1024, 3000])))
        elif kind == 1:
            pods.append(peer_pod(f"aliyun-{i}", "aliyun.com/gpu-mem", rng.choice([1, 2, 5])))
        else:
            pods.append(shared_pod(f"ours-{i}", rng.choice([2048, 4096]), 300, cpu="100m"))
    return pods


async def test_peer_and_kubegpu_pods_fill_cards_without_overcommit() -> None:
    rng = random.Random(18)
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", 2, CARD_MIB))
        pods = mixed_pods(rng)
        for pod in pods:
            server.store.put("pods", pod)
        async with running_extender(server, names=NAMES) as ext, aiohttp.ClientSession() as http:
            # A peer pod passes filter like any share.
            status, body = await post(http, f"{ext.url}/filter", filter_args(pods[0], ["node-a"]))
            assert (status, body["NodeNames"]) == (200, ["node-a"])

            async def bind(pod: dict[str, Any]) -> str:
                name = pod["metadata"]["name"]
                uid = server.store.get("pods", "default", name)["metadata"]["uid"]  # type: ignore[index]
                status, body = await post(
                    http,
                    f"{ext.url}/bind",
                    {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": "node-a"},
                )
                assert status == 200, body
                return str(body["Error"])

            errors = await asyncio.gather(*(bind(p) for p in pods))
    milli, problems = audit(server)
    assert problems == []
    bound = [p for p in server.store.list("pods") if p["spec"].get("nodeName")]
    kinds = {p["metadata"]["name"].split("-")[0] for p in bound}
    assert kinds == {"volcano", "aliyun", "ours"}, "each style got onto the cards"
    refused = [e for e in errors if e]
    assert refused, "60 pods ask for more than two 16 GiB cards hold"
    assert all("node-a" in e for e in refused)
    # Filled: what is left on each card is less than the smallest pod still waiting (1 GiB).
    held: dict[str, int] = {}
    for pod in bound:
        decision = read_claim(pod, NAMES).decision
        assert decision is not None
        for card in decision.cards:
            held[card.uuid] = held.get(card.uuid, 0) + card.gpu_memory_mib
    assert len(held) == 2 and all(CARD_MIB - 1024 < mib <= CARD_MIB for mib in held.values())
    assert all(m <= 1000 for m in milli.values())
