"""Test cluster builders: nodes with a published GPU inventory, GPU pods in the shapes users
write them, and a running extender against the fake API server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

from kubegpu.config.extender import ExtenderConfig
from kubegpu.kube.list_watch import Backoff
from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.annotations import (
    INVENTORY_ANNOTATION,
    GpuRecord,
    NodeGpuInventory,
    encode_inventory,
)
from kubegpu.testing.apiserver import FakeApiServer, make_node, make_pod

MEMORY = "kubegpu.io/gpu-memory"
COMPUTE = "kubegpu.io/gpu-compute"
SLOT = "kubegpu.io/gpu-shared"
WHOLE = "nvidia.com/gpu"
# The fake preset 2xV100-2xT4's models, as NVML names them and the node agent publishes them.
V100, T4 = "Tesla V100-SXM2-16GB", "Tesla T4"


def inventory(
    node: str,
    cards: int,
    memory_mib: int = 81920,
    model: str = "A100-SXM4-80GB",
    unhealthy: Sequence[int] = (),
) -> NodeGpuInventory:
    return NodeGpuInventory(
        tuple(
            GpuRecord(f"GPU-{node}-{i:02d}", i, model, memory_mib, i not in unhealthy)
            for i in range(cards)
        )
    )


def gpu_node(
    name: str,
    cards: int = 4,
    memory_mib: int = 81920,
    *,
    cpu: str = "64",
    memory: str = "512Gi",
    model: str = "A100-SXM4-80GB",
    unhealthy: Sequence[int] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    inv = encode_inventory(inventory(name, cards, memory_mib, model, unhealthy))
    return make_node(
        name,
        cpu=cpu,
        memory=memory,
        extended={WHOLE: str(cards), SLOT: str(cards * 16)},
        annotations={INVENTORY_ANNOTATION: inv, **(annotations or {})},
    )


def mixed_node(
    name: str, cards: Sequence[tuple[str, int]], *, cpu: str = "64", memory: str = "512Gi"
) -> dict[str, Any]:
    """A node whose cards are of several models: ``cards`` is (model, memory MiB) per card,
    in index order, published as the node agent does."""
    inv = NodeGpuInventory(
        tuple(
            GpuRecord(f"GPU-{name}-{i:02d}", i, model, mib) for i, (model, mib) in enumerate(cards)
        )
    )
    return make_node(
        name,
        cpu=cpu,
        memory=memory,
        extended={WHOLE: str(len(cards)), SLOT: str(len(cards) * 16)},
        annotations={INVENTORY_ANNOTATION: encode_inventory(inv)},
    )


def shared_pod(
    name: str, memory_mib: int, compute_milli: int, *, cpu: str = "1", namespace: str = "default"
) -> dict[str, Any]:
    return make_pod(
        name,
        namespace,
        requests={"cpu": cpu, "memory": "1Gi"},
        limits={MEMORY: str(memory_mib), COMPUTE: str(compute_milli), SLOT: "1"},
    )


def whole_pod(
    name: str, gpus: int, *, cpu: str = "1", namespace: str = "default"
) -> dict[str, Any]:
    return make_pod(
        name, namespace, requests={"cpu": cpu, "memory": "1Gi"}, limits={WHOLE: str(gpus)}
    )


def filter_args(pod: dict[str, Any], nodes: Sequence[str]) -> dict[str, Any]:
    """ExtenderArgs exactly as a node-cache-capable kube-scheduler sends them."""
    return {"Pod": pod, "Nodes": None, "NodeNames": list(nodes)}


@contextlib.asynccontextmanager
async def running_extender(
    server: FakeApiServer, policy: str = "kubegpu", **settings: Any
) -> AsyncIterator[ExtenderService]:
    config = ExtenderConfig(port=0, policy=policy, **settings)
    client = server.async_client()
    service = ExtenderService(config, client=client, backoff=Backoff(0.01, 0.05))
    async with service:
        await service.wait_synced()
        yield service
    await client.close()


@contextlib.asynccontextmanager
async def http_session() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json(content_type=None)
