"""The extender's spread policy and the simulator's give a share the same card on the same
cluster state: both go through the placement engine's spread policy (the extender no longer
keeps a card choice of its own). Checked over real HTTP against the fake API server."""

from __future__ import annotations

from typing import Any

from kubegpu.placement.engine import PlacementEngine
from kubegpu.placement.policies import get_policy
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.sharing.resources import gpu_request
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import gpu_node, http_session, post, running_extender, shared_pod


async def bind(http: Any, url: str, server: FakeApiServer, name: str, node: str) -> None:
    uid = server.store.get("pods", "default", name)["metadata"]["uid"]
    _, body = await post(
        http,
        f"{url}/bind",
        {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node},
    )
    assert body == {"Error": ""}


def card_of(server: FakeApiServer, name: str) -> int:
    annotations = server.store.get("pods", "default", name)["metadata"]["annotations"]
    return decode_allocation(annotations[ALLOCATION_ANNOTATION]).cards[0].index


async def test_extender_and_simulator_give_a_share_the_same_card_under_spread() -> None:
    # Three cards left with 500, 700 and 300 free milli: spread takes the emptiest (card 1),
    # where BestFit would take the tightest (card 2).
    first = [("a", 10240, 500), ("b", 4096, 300), ("c", 20480, 700)]
    incoming = shared_pod("next", 1024, 200)
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=3))
        for name, memory, milli in first:
            server.store.put("pods", shared_pod(name, memory, milli))
        server.store.put("pods", incoming)
        async with running_extender(server, policy="spread") as ext, http_session() as http:
            for name, _, _ in first:
                await bind(http, ext.url, server, name, "node-a")
            live = ext.scheduler.engine()
            states = [live.node_state(name) for name in live.names]
            await bind(http, ext.url, server, "next", "node-a")
    assert sorted(card_of(server, name) for name, _, _ in first) == [0, 1, 2]
    offline = PlacementEngine(states, get_policy("spread"))
    chosen = offline.choose(gpu_request(incoming).to_placement())
    assert chosen is not None and chosen.node == "node-a"
    free = {g.index: g.free_milli for g in states[0].gpus}
    assert free[chosen.gpu_indices[0]] == max(free.values())
    assert card_of(server, "next") == chosen.gpu_indices[0]
