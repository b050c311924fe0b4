"""1,000 concurrent binds of mixed shared and whole-GPU pods onto 10 nodes through the fake API
server, all in flight at once: no card is ever over-committed (audited from the pods'
annotations, not from the extender's memory), every pod is bound or refused with a reason, and a
restarted extender rebuilds exactly the state the old one had. (An extender killed with binds
in flight: test_kill.py.)"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import aiohttp
import pytest

from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.annotations import (
    ALLOCATION_ANNOTATION,
    INVENTORY_ANNOTATION,
    decode_allocation,
    decode_inventory,
)
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import (
    gpu_node,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)

pytestmark = pytest.mark.slow

NODES = [f"node-{i}" for i in range(10)]
PODS = 1000


def make_pods(rng: random.Random) -> list[dict[str, Any]]:
    pods = []
    for i in range(PODS):
        if rng.random() < 0.7:
            pods.append(
                shared_pod(
                    f"s-{i:04d}",
                    rng.choice([1024, 4096, 10240, 20480, 40960]),
                    rng.choice([50, 100, 250, 300, 500]),
                    cpu="500m",
                )
            )
        else:
            pods.append(whole_pod(f"w-{i:04d}", rng.choice([1, 1, 2, 4]), cpu="500m"))
    return pods


async def caught_up(service: ExtenderService, server: FakeApiServer) -> None:
    """Wait until the extender's watch has applied the newest version of every pod."""

    def same() -> bool:
        stored = {
            (p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["resourceVersion"]
            for p in server.store.list("pods")
        }
        seen = {k: v["metadata"]["resourceVersion"] for k, v in service.view.pod_json.items()}
        return stored == seen and not service.view.reservations

    await wait_until_async(
        same, timeout_s=10, what="the extender's view caught up with the API server", poll_s=0.02
    )


def audit(server: FakeApiServer) -> tuple[dict[str, int], list[str]]:
    """Per card: compute and memory held by bound or decided pods, from the annotations only."""
    capacity = {}
    for node in server.store.list("nodes"):
        for gpu in decode_inventory(node["metadata"]["annotations"][INVENTORY_ANNOTATION]).gpus:
            capacity[gpu.uuid] = (node["metadata"]["name"], gpu.memory_mib)
    milli: dict[str, int] = defaultdict(int)
    memory: dict[str, int] = defaultdict(int)
    problems = []
    for pod in server.store.list("pods"):
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        bound = pod["spec"].get("nodeName")
        if raw is None:
            if bound:
                problems.append(f"{pod['metadata']['name']} bound without a decision")
            continue
        decision = decode_allocation(raw)
        if bound and bound != decision.node:
            problems.append(f"{pod['metadata']['name']} bound to {bound}, decided {decision.node}")
        for card in decision.cards:
            assert capacity[card.uuid][0] == decision.node
            milli[card.uuid] += card.compute_milli
            memory[card.uuid] += card.gpu_memory_mib
    for uuid, used in milli.items():
        if used > 1000:
            problems.append(f"{uuid}: {used} milli")
    for uuid, used in memory.items():
        if used > capacity[uuid][1]:
            problems.append(f"{uuid}: {used} MiB of {capacity[uuid][1]}")
    return dict(milli), problems


async def bind_all(
    service: ExtenderService, server: FakeApiServer, pods: list[dict[str, Any]], rng: random.Random
) -> tuple[dict[str, str], int]:
    """Every pod's bind on a random node, all at once; each pod's Error, and how many
    connections the client opened."""
    opened = 0

    async def count(*_: Any) -> None:
        nonlocal opened
        opened += 1

    tracing = aiohttp.TraceConfig()
    tracing.on_connection_create_end.append(count)
    # No connection limit: every bind is on the wire at once, as from a scheduler whose
    # binding cycles (one goroutine each) all reach the extender together.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[tracing]) as http:

        async def one(pod: dict[str, Any]) -> tuple[str, str]:
            name = pod["metadata"]["name"]
            uid = server.store.get("pods", "default", name)["metadata"]["uid"]  # type: ignore[index]
            status, body = await post(
                http,
                f"{service.url}/bind",
                {
                    "PodName": name,
                    "PodNamespace": "default",
                    "PodUID": uid,
                    "Node": rng.choice(NODES),
                },
            )
            assert status == 200, body
            return name, body["Error"]

        errors = dict(await asyncio.gather(*(one(p) for p in pods)))
    return errors, opened


async def test_concurrent_binds_never_overcommit_a_card_and_a_restart_rebuilds_the_same_state() -> (
    None
):
    rng = random.Random(7)
    pods = make_pods(rng)
    async with FakeApiServer() as server:
        for name in NODES:
            server.store.put(
                "nodes", gpu_node(name, cards=8, memory_mib=81920, cpu="256", memory="2Ti")
            )
        for pod in pods:
            server.store.put("pods", pod)
        async with running_extender(server, policy="kubegpu") as first:
            errors, connections = await bind_all(first, server, pods, rng)
            await caught_up(first, server)
            before = first.view.snapshot()
            engine_before = {n: first.scheduler.engine().node_state(n) for n in NODES}
        async with running_extender(server, policy="kubegpu") as second:
            await caught_up(second, server)
            assert second.view.snapshot() == before
            assert {n: second.scheduler.engine().node_state(n) for n in NODES} == engine_before
            final = second.view.snapshot()
        held, problems = audit(server)

    # One connection per bind: none waited for another's connection to come free.
    assert connections == PODS

    assert problems == []
    assert len(errors) == PODS
    bound = {p["metadata"]["name"] for p in server.store.list("pods") if p["spec"].get("nodeName")}
    for name, error in errors.items():
        if error:
            assert name not in bound, name
            assert error.startswith("node-"), error  # "<node>: <why>", actionable
        else:
            assert name in bound, name
    assert 0 < len(bound) < PODS  # the cluster filled up: both outcomes happened
    assert sum(held.values()) > 0.9 * 80 * 1000  # and it filled up nearly to the last card
    # The view the extender ends with agrees with the annotations it wrote.
    view_held: dict[str, int] = defaultdict(int)
    for usage in final.pods.values():
        for card in usage.cards:
            view_held[card.uuid] += card.compute_milli
    assert dict(view_held) == held
