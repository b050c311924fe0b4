"""Many clients binding at once against the fake API server: every write is atomic, so each
pod is bound exactly once and distinct pods never interfere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import lightkube
import pytest
from lightkube import ApiError
from lightkube.generic_resource import GenericNamespacedStatus
from lightkube.resources.core_v1 import ConfigMap, Pod, PodBinding

from kubegpu.testing.apiserver import FakeApiServer, make_pod


class PodBindingRequest(GenericNamespacedStatus):
    """pods/binding with a dict-typed reply (the server answers with a v1.Status)."""

    _api_info = PodBinding._api_info


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


async def bind(client: lightkube.AsyncClient, pod: str, node: str) -> str:
    """'ok' or the reason of the ApiError."""
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    try:
        await client.create(PodBindingRequest(body), name=pod, namespace="default")
    except ApiError as error:
        return error.status.reason
    return "ok"


async def test_200_concurrent_binds_of_distinct_pods_all_succeed(server: FakeApiServer) -> None:
    for i in range(200):
        server.store.put("pods", make_pod(f"p{i}"))
    before = server.store.resource_version
    clients = [server.async_client() for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(bind(clients[i % 4], f"p{i}", f"node-{i % 10}") for i in range(200))
        )
    finally:
        for client in clients:
            await client.close()
    assert results == ["ok"] * 200
    assert server.store.resource_version == before + 200
    for i in range(200):
        assert server.store.get("pods", "default", f"p{i}")["spec"]["nodeName"] == f"node-{i % 10}"


async def test_50_concurrent_binds_of_one_pod_yield_exactly_one_success(
    server: FakeApiServer,
) -> None:
    server.store.put("pods", make_pod("contested"))
    client = server.async_client()
    try:
        results = await asyncio.gather(*(bind(client, "contested", f"node-{i}") for i in range(50)))
    finally:
        await client.close()
    assert sorted(results) == ["Conflict"] * 49 + ["ok"]
    winner = results.index("ok")
    assert server.store.get("pods", "default", "contested")["spec"]["nodeName"] == f"node-{winner}"


async def test_concurrent_read_modify_write_with_resource_versions_loses_no_update(
    server: FakeApiServer,
) -> None:
    # The optimistic-concurrency loop the extender uses for annotations: get, change, replace
    # with the version read; retry on 409. Every increment must land exactly once.
    server.store.put("configmaps", {"metadata": {"name": "counter"}, "data": {"n": "0"}})
    client = server.async_client()
    conflicts = 0

    async def increment() -> None:
        nonlocal conflicts
        while True:
            current = await client.get(ConfigMap, "counter")
            current.data = {"n": str(int(current.data["n"]) + 1)}
            try:
                await client.replace(current)
                return
            except ApiError as error:
                assert error.status.code == 409
                conflicts += 1

    try:
        await asyncio.gather(*(increment() for _ in range(20)))
    finally:
        await client.close()
    assert server.store.get("configmaps", "default", "counter")["data"] == {"n": "20"}


async def test_pods_bound_concurrently_are_all_visible_in_one_list(server: FakeApiServer) -> None:
    for i in range(20):
        server.store.put("pods", make_pod(f"p{i}"))
    client = server.async_client()
    try:
        await asyncio.gather(*(bind(client, f"p{i}", "node-a") for i in range(20)))
        bound = [p async for p in client.list(Pod, fields={"spec.nodeName": "node-a"})]
    finally:
        await client.close()
    assert len(bound) == 20


@pytest.mark.slow
async def test_1000_binds_from_20_clients_at_once_each_land_exactly_once(
    server: FakeApiServer,
) -> None:
    for i in range(500):
        server.store.put("pods", make_pod(f"p{i}"))
    clients = [server.async_client() for _ in range(20)]
    try:
        # Two binds per pod, to different nodes, all in flight together.
        results = await asyncio.gather(
            *(bind(clients[i % 20], f"p{i % 500}", f"node-{i % 7}") for i in range(1000))
        )
    finally:
        for client in clients:
            await client.close()
    assert sorted(set(results)) == ["Conflict", "ok"]
    assert results.count("ok") == 500
    bound = [
        server.store.get("pods", "default", f"p{i}")["spec"].get("nodeName") for i in range(500)
    ]
    assert all(bound)
