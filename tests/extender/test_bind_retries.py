"""Binds of one pod that overlap, as when kube-scheduler gives up on a bind after its
``httpTimeout`` and retries it (perhaps on another node) while the first handler still waits on a
slow API server: they run one after another, however many queue up, so no two reservations of
the pod overwrite each other and no card is promised twice. Over real HTTP against the fake API
server, with the API held on one pod's Bindings (which carry its decision)."""

from __future__ import annotations

import asyncio
from typing import Any

from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.testing.apiserver import FakeApiServer, StatusError, Store
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import gpu_node, http_session, post, running_extender, shared_pod


def card_load(server: FakeApiServer) -> dict[str, int]:
    """Milli of each card held by pods bound with a decision, from the stored pods only."""
    load: dict[str, int] = {}
    for pod in server.store.list("pods"):
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if raw is None or not pod["spec"].get("nodeName"):
            continue
        for card in decode_allocation(raw).cards:
            load[card.uuid] = load.get(card.uuid, 0) + card.compute_milli
    return load


async def test_three_overlapping_binds_of_one_pod_and_one_of_another_never_overcommit() -> None:
    async with FakeApiServer() as server:
        # One card a node: pods of 600 milli fit one to a card.
        server.store.put("nodes", gpu_node("node-1", cards=1))
        server.store.put("nodes", gpu_node("node-2", cards=1))
        server.store.put("pods", shared_pod("a", 4096, 600))
        server.store.put("pods", shared_pod("b", 4096, 600))
        uids = {n: server.store.get("pods", "default", n)["metadata"]["uid"] for n in "ab"}  # type: ignore[index]

        # The API is slow on pod a's Bindings: each waits for the test to let it go. The first
        # then fails (a 500), the others go through.
        reached = [asyncio.Event() for _ in range(3)]
        release = [asyncio.Event() for _ in range(3)]
        patches = 0

        async def slow(_: Store) -> None:
            nonlocal patches
            index = min(patches, 2)
            patches += 1
            reached[index].set()
            await release[index].wait()
            if index == 0:
                raise StatusError("InternalError", "etcd is slow today")

        server.before("create", "pods/binding", slow, name="a", count=10)

        async with running_extender(server) as ext, http_session() as http:

            async def bind(pod: str, node: str) -> str:
                body = {"PodName": pod, "PodNamespace": "default", "PodUID": uids[pod]}
                status, answer = await post(http, f"{ext.url}/bind", {**body, "Node": node})
                assert status == 200, answer
                error: str = answer["Error"]
                return error

            first = asyncio.create_task(bind("a", "node-1"))
            await reached[0].wait()
            # The scheduler's retry of a, on the same node, queues behind the first.
            second = asyncio.create_task(bind("a", "node-1"))

            def binds_of_a() -> int:  # holding or waiting for a's lock (PodLocks counts them)
                return ext.app.pod_locks._locks.get(uids["a"], (None, 0))[1]

            # Let it reach the extender and wait for the pod.
            await wait_until_async(
                lambda: binds_of_a() == 2, timeout_s=10, what="the second bind queued on pod a"
            )
            release[0].set()
            assert "etcd is slow today" in await first
            await reached[1].wait()  # the second holds a reservation of a on node-1
            # A third try, on the other node, while the second still waits on the API.
            third = asyncio.create_task(bind("a", "node-2"))
            # It must queue behind the second (and so never get here while it waits): wait
            # until it has either queued on a's lock or, overtaking, reached the API.
            await wait_until_async(
                lambda: binds_of_a() == 2 or reached[2].is_set(),
                timeout_s=10,
                what="the third bind queued on pod a or at the API",
            )
            # Another pod for node-1's one card, while a's reservation there is in flight.
            other = await bind("b", "node-1")
            release[1].set()
            release[2].set()
            results: list[Any] = [await second, await third]
            assert len(ext.app.pod_locks) == 0  # nothing kept per pod once its binds end

        load = card_load(server)
        a = server.store.get("pods", "default", "a")
        assert a is not None
    assert all(milli <= 1000 for milli in load.values()), load
    # a is bound once, where its second bind put it; b was refused the card a holds, and the
    # third bind of a (to the other node) found it bound already.
    assert a["spec"]["nodeName"] == "node-1"
    assert results[0] == ""
    assert "already bound to node-1" in results[1]
    assert other != ""
    assert load == {"GPU-node-1-00": 600}
