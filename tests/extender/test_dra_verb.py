"""``POST /prioritize-dra`` over real HTTP: the running extender (nodes and pods from the fake
API server) with its DRA view fed by list + watch from a ``resource.k8s.io`` stand-in."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubegpu.extender.dra_rank import DraRanker
from kubegpu.kube.dra_view import DraClusterView
from kubegpu.kube.list_watch import Backoff
from kubegpu.roles.extender import ExtenderService
from kubegpu.testing.apiserver import FakeApiServer, make_node
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import filter_args, http_session, post, running_extender, whole_pod
from tests.extender.dra_api import DraApi, serve
from tests.extender.dra_cluster import (
    claim,
    dra_pod,
    node_slice,
    share_request,
    share_result,
    whole_result,
)

NODES = ["plain", "dra-a", "dra-b"]


@contextlib.asynccontextmanager
async def dra_extender(api: DraApi, policy: str = "binpack") -> AsyncIterator[ExtenderService]:
    """The extender, its node view on the fake API server, its DRA view on ``api``."""
    async with FakeApiServer() as server:
        for name in NODES:
            server.store.put("nodes", make_node(name, cpu="32"))
        async with serve(api) as dra_client, running_extender(server, policy=policy) as ext:
            view = DraClusterView(dra_client, backoff=Backoff(0.01, 0.05))
            ext.app.dra = DraRanker(ext.scheduler, view)
            try:
                yield ext
            finally:
                await view.close()


def scores(body: list[dict[str, Any]]) -> dict[str, int]:
    assert all(set(entry) == {"Host", "Score"} for entry in body)
    return {entry["Host"]: entry["Score"] for entry in body}


async def test_a_dra_pod_is_ranked_from_the_slices_and_the_allocated_claims() -> None:
    api = DraApi()
    api.put("resourceslices", node_slice("dra-a", 2))
    api.put("resourceslices", node_slice("dra-b", 2))
    # dra-b has a half-used card: binpack puts the next share there.
    api.put("resourceclaims", claim("held", results=[share_result("dra-b", 0, "40Gi", "500")]))
    api.put("resourceclaims", claim("mine", [share_request("10Gi", "200")]))
    pod = dra_pod("p", {"gpu": "mine"})
    async with dra_extender(api) as ext, http_session() as http:
        url = f"{ext.url}/prioritize-dra"
        assert ext.app.dra is not None
        view = ext.app.dra.dra

        async def ranked() -> dict[str, int]:
            status, body = await post(http, url, filter_args(pod, NODES))
            assert status == 200
            return scores(body)

        # The first call starts the DRA view; until it has listed, every node scores 0.
        assert await ranked() == dict.fromkeys(NODES, 0)
        await wait_until_async(view.synced.is_set, timeout_s=30, what="the DRA view's lists")
        assert await ranked() == {"plain": 0, "dra-a": 0, "dra-b": 10}

        # Another claim takes most of dra-a (70 % of card 0, card 1 whole): dra-a is now the
        # tighter fit, and the watch tells the extender.
        api.put(
            "resourceclaims",
            claim(
                "other", results=[share_result("dra-a", 0, "40Gi", "700"), whole_result("dra-a", 1)]
            ),
        )

        async def dra_a_first() -> bool:
            return await ranked() == {"plain": 0, "dra-a": 10, "dra-b": 0}

        await wait_until_async(dra_a_first, timeout_s=30, what="dra-a ranked first")


async def test_a_gpu_pod_without_claims_scores_zero_and_its_call_starts_the_dra_lists() -> None:
    # A device-plugin GPU pod is /prioritize's; a CPU-only pod is ranked here by the policy
    # (tests/extender/test_ranking.py). Any call of the entry starts the DRA lists, so the
    # first DRA pod finds them loaded (kube-scheduler calls the entry for every pod).
    api = DraApi()
    api.put("resourceslices", node_slice("dra-a", 2))
    async with dra_extender(api) as ext, http_session() as http:
        assert api.lists == []  # nothing listed before the entry is called
        pod = whole_pod("p", 1)
        status, body = await post(http, f"{ext.url}/prioritize-dra", filter_args(pod, NODES))
        assert status == 200 and scores(body) == dict.fromkeys(NODES, 0)
        assert ext.app.dra is not None
        await wait_until_async(
            ext.app.dra.dra.synced.is_set, timeout_s=30, what="the DRA view's lists"
        )
    assert sorted({kind for kind, _ in api.lists}) == ["resourceclaims", "resourceslices"]


async def test_a_pod_whose_claim_is_unknown_scores_zero_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = DraApi()
    api.put("resourceslices", node_slice("dra-a", 2))
    async with dra_extender(api) as ext, http_session() as http:
        assert ext.app.dra is not None
        ext.app.dra.dra.start()
        await wait_until_async(ext.app.dra.dra.synced.is_set, timeout_s=30, what="DRA lists")
        with caplog.at_level(logging.INFO, logger="kubegpu.extender.dra_rank"):
            pod = dra_pod("lost", {"gpu": "gone"})
            status, body = await post(http, f"{ext.url}/prioritize-dra", filter_args(pod, NODES))
    assert status == 200 and scores(body) == dict.fromkeys(NODES, 0)
    assert "pod default/lost: DRA nodes not ranked: resourceclaim default/gone" in caplog.text


async def test_a_malformed_body_is_refused_with_a_json_error() -> None:
    async with FakeApiServer() as server, running_extender(server) as ext, http_session() as http:
        status, body = await post(http, f"{ext.url}/prioritize-dra", {"Pod": 3})
    assert status == 400 and "Pod must be an object" in body["Error"]


async def test_the_default_wiring_answers_zero_for_a_gpu_pod_without_claims() -> None:
    # No DRA stand-in: the extender as the role builds it; a plain GPU pod touches no DRA
    # object.
    async with FakeApiServer() as server:
        server.store.put("nodes", make_node("n1"))
        async with running_extender(server) as ext, http_session() as http:
            pod = whole_pod("p", 1)
            status, body = await post(http, f"{ext.url}/prioritize-dra", filter_args(pod, ["n1"]))
    assert status == 200 and body == [{"Host": "n1", "Score": 0}]
