"""A node mixing card models, over real HTTP against the fake API server: the extender reads
each card's model from the node agent's inventory annotation, places a pod restricted with
``kubegpu.io/gpu-models`` only on cards of those models, and says plainly why a node cannot
take it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.sharing.resources import GPU_MODELS_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import (
    T4,
    V100,
    filter_args,
    gpu_node,
    http_session,
    mixed_node,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)

# Reasons name models as the feature labels spell them, the spelling models compare in.
V100_LABEL, T4_LABEL = "Tesla-V100-SXM2-16GB", "Tesla-T4"
NODES = ["node-m", "node-t4"]


def cluster(server: FakeApiServer) -> None:
    # node-m is the fake preset 2xV100-2xT4; node-t4 one T4 with too little CPU for the pods.
    server.store.put(
        "nodes", mixed_node("node-m", [(V100, 16384), (V100, 16384), (T4, 15360), (T4, 15360)])
    )
    server.store.put("nodes", gpu_node("node-t4", cards=1, memory_mib=15360, model=T4, cpu="500m"))


def restricted(pod: dict[str, Any], models: str) -> dict[str, Any]:
    pod["metadata"]["annotations"] = {GPU_MODELS_ANNOTATION: models}
    return pod


async def schedule(
    http: aiohttp.ClientSession, url: str, server: FakeApiServer, pod: dict[str, Any]
) -> tuple[dict[str, Any], tuple[int, ...]]:
    """kube-scheduler's round for one pod: filter, then bind on the node that passed (there is
    at most one here); the filter answer and the cards the decision names."""
    stored = server.store.put("pods", pod)
    _, body = await post(http, f"{url}/filter", filter_args(pod, NODES))
    if not body["NodeNames"]:
        return body, ()
    (node,) = body["NodeNames"]
    name = pod["metadata"]["name"]
    binding = {
        "PodName": name,
        "PodNamespace": "default",
        "PodUID": stored["metadata"]["uid"],
        "Node": node,
    }
    status, answer = await post(http, f"{url}/bind", binding)
    assert (status, answer) == (200, {"Error": ""})
    bound = server.store.get("pods", "default", name)
    assert bound is not None
    decision = decode_allocation(bound["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert decision.node == node
    return body, decision.gpu_indices


@pytest.mark.parametrize("policy", ["kubegpu", "fgd", "binpack", "spread"])
async def test_a_restricted_pod_gets_cards_of_its_model_on_a_mixed_node(policy: str) -> None:
    async with FakeApiServer() as server:
        cluster(server)
        async with running_extender(server, policy) as ext, http_session() as http:
            three = restricted(whole_pod("train-3", 3), V100)
            body, cards = await schedule(http, ext.url, server, three)
            assert cards == ()
            assert body["FailedAndUnresolvableNodes"] == {
                "node-m": f"node(s) have fewer than 3 healthy GPUs of model {V100_LABEL}",
                "node-t4": f"node(s) have no healthy GPU of model {V100_LABEL}",
            }

            # The T4 share first: on a V100 it would leave too few V100s for the pair next.
            infer = restricted(shared_pod("infer", 6144, 400), T4)
            body, shared_card = await schedule(http, ext.url, server, infer)
            assert body["NodeNames"] == ["node-m"] and shared_card in ((2,), (3,))
            assert body["FailedNodes"] == {"node-t4": "node(s) have less than 1000 milli-CPU free"}

            _, cards = await schedule(
                http, ext.url, server, restricted(whole_pod("train-2", 2), V100)
            )
            assert cards == (0, 1)

            # The V100s are taken and a T4 is still fully free: not for a V100 pod.
            one = restricted(whole_pod("train-1", 1), V100)
            body, cards = await schedule(http, ext.url, server, one)
            assert cards == ()
            assert body["FailedNodes"] == {
                "node-m": f"node(s) have fewer than 1 whole GPUs of model {V100_LABEL} free"
            }
            # A pod without a model takes what is left: the other T4.
            _, cards = await schedule(http, ext.url, server, whole_pod("any-1", 1))
            assert cards == ((5 - shared_card[0]),)


async def test_the_label_spelling_of_a_model_selects_the_same_cards() -> None:
    async with FakeApiServer() as server:
        cluster(server)
        async with running_extender(server, "kubegpu") as ext, http_session() as http:
            # Copied from the kubegpu.io/gpu.product.Tesla-T4 label rather than the inventory.
            pair = restricted(whole_pod("t4-pair", 2), T4_LABEL)
            body, cards = await schedule(http, ext.url, server, pair)
            assert body["NodeNames"] == ["node-m"]
            assert sorted(cards) == [2, 3]


async def test_a_model_name_that_is_no_name_is_refused_naming_it() -> None:
    async with FakeApiServer() as server:
        cluster(server)
        async with running_extender(server, "kubegpu") as ext, http_session() as http:
            pod = restricted(whole_pod("odd", 1), "--")
            server.store.put("pods", pod)
            _, body = await post(http, f"{ext.url}/filter", filter_args(pod, NODES))
            # Every node is unresolvable for it, with the reason naming the value.
            reason = (
                "pod default/odd: annotation kubegpu.io/gpu-models: '--' is not a GPU model name"
            )
            assert body["NodeNames"] == []
            assert body["FailedAndUnresolvableNodes"] == dict.fromkeys(NODES, reason)
