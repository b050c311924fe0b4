"""Decisions in flight (kubegpu.extender.inflight), over real HTTP to the real extender app.

kube-scheduler binds asynchronously: it filters and scores pod N+1 before pod N's bind reaches
the extender. These tests play kube-scheduler's calls in that order (filter and prioritize of
several pods back to back, then their binds) on nearly full nodes, and check that the extender's
answers for the later pods already count the earlier ones, so no bind is refused; and that a
tentative reservation ends when its bind goes elsewhere, its pod is deleted or retried, or its
time runs out, never holding room for ever.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest

from kubegpu.extender.inflight import MAX_MISSES
from kubegpu.roles.extender import ExtenderService
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION, decode_allocation
from kubegpu.testing.apiserver import FakeApiServer
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import (
    filter_args,
    gpu_node,
    http_session,
    post,
    running_extender,
    shared_pod,
    whole_pod,
)

CARD = 16384


class Scheduler:
    """kube-scheduler's calls to the extender, as a node-cache-capable kube-scheduler makes
    them: filter, then prioritize unless only one node passed, then the extender's top node
    (kube-scheduler adds its own scores and breaks ties at random; these tests take the first
    top-scored node, the extender's guess, unless told otherwise)."""

    def __init__(self, server: FakeApiServer, ext: ExtenderService, http: aiohttp.ClientSession):
        self.server, self.ext, self.http = server, ext, http

    def pod(self, name: str) -> dict[str, Any]:
        pod = self.server.store.get("pods", "default", name)
        assert pod is not None
        return pod

    async def filter(self, name: str, nodes: Sequence[str]) -> dict[str, Any]:
        status, body = await post(
            self.http, f"{self.ext.url}/filter", filter_args(self.pod(name), nodes)
        )
        assert status == 200
        return dict(body)

    async def scores(self, name: str, nodes: Sequence[str]) -> dict[str, int]:
        status, body = await post(
            self.http, f"{self.ext.url}/prioritize", filter_args(self.pod(name), nodes)
        )
        assert status == 200
        return {entry["Host"]: entry["Score"] for entry in body}

    async def cycle(self, name: str, nodes: Sequence[str]) -> str | None:
        """One scheduling cycle: the node kube-scheduler would bind the pod to, or None."""
        passed = (await self.filter(name, nodes))["NodeNames"]
        if len(passed) <= 1:
            return passed[0] if passed else None
        scores = await self.scores(name, passed)
        return max(passed, key=lambda node: scores.get(node, 0))  # first of the top ones

    async def bind(self, name: str, node: str) -> str:
        uid = self.pod(name)["metadata"]["uid"]
        body = {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}
        status, reply = await post(self.http, f"{self.ext.url}/bind", body)
        assert status == 200
        return str(reply["Error"])

    async def metrics(self) -> dict[str, float]:
        async with self.http.get(f"{self.ext.url}/metrics") as response:
            text = await response.text()
        found = {}
        for line in text.splitlines():
            match = re.match(r"(kubegpu_extender_(?:tentative|stale)\S*) (\S+)$", line)
            if match:
                found[match[1]] = float(match[2])
        return found


def tentative(event: str) -> str:
    return f'kubegpu_extender_tentative_reservations_total{{event="{event}"}}'


def stale(where: str) -> str:
    return f'kubegpu_extender_stale_binds_total{{tentative="{where}"}}'


def over_committed(server: FakeApiServer) -> list[str]:
    """Cards holding more than they have, from the pods' annotations only."""
    held: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for pod in server.store.list("pods"):
        raw = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if raw:
            for card in decode_allocation(raw).cards:
                held[card.uuid][0] += card.compute_milli
                held[card.uuid][1] += card.gpu_memory_mib
    return [uuid for uuid, (milli, mib) in held.items() if milli > 1000 or mib > CARD]


async def seeded(server: FakeApiServer, pods: Sequence[dict[str, Any]]) -> None:
    for pod in pods:
        server.store.put("pods", pod)


async def fill(sched: Scheduler, nodes: Sequence[str], per_node: Sequence[int]) -> None:
    """Bind a filler share of ``per_node[i]`` MiB to each node (each card of one)."""
    fillers = [shared_pod(f"fill-{n}", mib, 100) for n, mib in zip(nodes, per_node, strict=True)]
    await seeded(sched.server, fillers)
    await wait_until_async(
        lambda: all(("default", p["metadata"]["name"]) in sched.ext.view.pod_json for p in fillers),
        timeout_s=10,
        what="the fillers in the extender's view",
    )
    for node, pod in zip(nodes, fillers, strict=True):
        assert await sched.bind(pod["metadata"]["name"], node) == ""


async def burst(sched: Scheduler, names: Sequence[str], nodes: Sequence[str], depth: int) -> list:
    """kube-scheduler's order with ``depth`` pods in flight: the cycles of ``depth`` pods back
    to back, then their binds, all at once. Returns (pod, node, bind error) per pod."""
    results = []
    for start in range(0, len(names), depth):
        batch = names[start : start + depth]
        chosen = [await sched.cycle(name, nodes) for name in batch]
        errors = await asyncio.gather(
            *(sched.bind(n, node) for n, node in zip(batch, chosen, strict=True) if node)
        )
        placed = iter(errors)
        results += [
            (n, node, next(placed) if node else "unschedulable")
            for n, node in zip(batch, chosen, strict=True)
        ]
    return results


@pytest.mark.parametrize("depth", [2, 4])
async def test_pods_scored_before_the_last_bind_landed_are_never_refused_at_bind(
    depth: int,
) -> None:
    """Prioritize N, prioritize N+1, bind N, bind N+1 on nodes with room for one share each:
    N+1 is sent to another node, not to N's, and every bind succeeds."""
    nodes = [f"node-{i}" for i in range(8)]
    async with FakeApiServer() as server:
        for node in nodes:
            server.store.put("nodes", gpu_node(node, cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            await fill(sched, nodes, [CARD // 2] * len(nodes))
            names = [f"p-{i}" for i in range(len(nodes))]
            await seeded(server, [shared_pod(n, CARD // 2, 100) for n in names])
            results = await burst(sched, names, nodes, depth)
            counts = await sched.metrics()
    assert [r for r in results if r[2]] == []  # no bind refused, none left out
    assert sorted(node for _, node, _ in results) == nodes  # one per node
    assert over_committed(server) == []
    assert counts[tentative("made")] == counts[tentative("confirmed")] == len(nodes)
    assert counts.get(stale("none"), 0) == 0


async def test_a_pipeline_of_twenty_on_twenty_nearly_full_nodes_binds_every_pod_it_filters() -> (
    None
):
    """Issue 27's shape: 20 nodes nearly full, 20 pods in flight at a time, mixed sizes."""
    rng = random.Random(27)
    nodes = [f"node-{i:02d}" for i in range(20)]
    async with FakeApiServer() as server:
        for node in nodes:
            server.store.put("nodes", gpu_node(node, cards=2, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            await fill(sched, nodes, [rng.choice([4096, 8192, 12288]) for _ in nodes])
            pods = []
            for i in range(120):
                if rng.random() < 0.8:
                    pods.append(shared_pod(f"p-{i:03d}", rng.choice([2048, 4096, 8192]), 50))
                else:
                    pods.append(whole_pod(f"p-{i:03d}", 1))
            await seeded(server, pods)
            names = [p["metadata"]["name"] for p in pods]
            results = await burst(sched, names, nodes, depth=20)
            counts = await sched.metrics()
    refused = [r for r in results if r[2] and r[2] != "unschedulable"]
    assert refused == []
    assert sum(1 for r in results if not r[2]) > 40  # the cluster really filled up
    assert over_committed(server) == []
    assert counts.get(stale("none"), 0) == counts.get(stale("same-node"), 0) == 0


async def test_a_bind_to_another_node_moves_the_room_there() -> None:
    nodes = ["node-a", "node-b", "node-c"]
    async with FakeApiServer() as server:
        for node in nodes:
            server.store.put("nodes", gpu_node(node, cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            await fill(sched, nodes, [CARD // 2] * 3)
            await seeded(server, [shared_pod(n, CARD // 2, 100) for n in ("first", "second")])
            expected = await sched.cycle("first", nodes)
            assert expected is not None
            # The second pod sees the first one's room taken where it is expected.
            others = [n for n in nodes if n != expected]
            assert (await sched.filter("second", nodes))["NodeNames"] == others
            # kube-scheduler's own scores chose another node: the bind goes there.
            assert await sched.bind("first", others[0]) == ""
            assert ext.view.tentative == {}
            passed = (await sched.filter("second", nodes))["NodeNames"]
            counts = await sched.metrics()
    assert passed == sorted([expected, others[1]])
    assert counts[tentative("moved")] == 1 and counts.get(tentative("confirmed"), 0) == 0


async def test_a_tentative_reservation_expires_when_no_bind_comes() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            now = [1000.0]
            ext.app.inflight.clock = lambda: now[0]
            await seeded(server, [shared_pod(n, CARD, 100) for n in ("dropped", "next")])
            assert await sched.cycle("dropped", ["node-a"]) == "node-a"  # one node: expected
            # kube-scheduler dropped the pod after choosing (a later plugin failed): no bind.
            refused = await sched.filter("next", ["node-a"])
            assert refused["NodeNames"] == [] and "node-a" in refused["FailedNodes"]
            now[0] += ext.app.inflight.ttl_s - 0.1
            assert (await sched.filter("next", ["node-a"]))["NodeNames"] == []
            now[0] += 0.2
            assert (await sched.filter("next", ["node-a"]))["NodeNames"] == ["node-a"]
            counts = await sched.metrics()
    assert counts[tentative("expired")] == 1
    assert counts[tentative("made")] == 2  # and "next" is now expected on node-a


async def test_a_deleted_pod_gives_its_room_back_at_once() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            await seeded(server, [shared_pod(n, CARD, 100) for n in ("gone", "next")])
            await sched.cycle("gone", ["node-a"])
            assert (await sched.filter("next", ["node-a"]))["NodeNames"] == []
            server.store.remove("pods", "default", "gone")
            await wait_until_async(
                lambda: ext.view.tentative == {}, timeout_s=10, what="the watch dropping it"
            )
            assert (await sched.filter("next", ["node-a"]))["NodeNames"] == ["node-a"]
            ext.app.inflight.clock = lambda: 1e12  # and its entry ends as gone
            ext.app.inflight.expire()
            counts = await sched.metrics()
    assert counts[tentative("gone")] == 1


async def test_a_retried_pod_replaces_its_own_tentative_reservation_and_never_stacks() -> None:
    async with FakeApiServer() as server:
        for node in ("node-a", "node-b"):
            server.store.put("nodes", gpu_node(node, cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            await seeded(server, [shared_pod("retried", CARD, 100)])
            nodes = ["node-a", "node-b"]
            first = await sched.cycle("retried", nodes)
            # Scored again (kube-scheduler retried the pod): its own room does not count
            # against it, and it is held once.
            for _ in range(MAX_MISSES - 1):
                assert (await sched.filter("retried", nodes))["NodeNames"] == nodes
                assert await sched.scores("retried", nodes) == await sched.scores("retried", nodes)
            assert list(ext.view.tentative) == [sched.pod("retried")["metadata"]["uid"]]
            assert ext.view.tentative[sched.pod("retried")["metadata"]["uid"]].node == first
            assert await sched.bind("retried", first or "") == ""
            counts = await sched.metrics()
    assert counts[tentative("confirmed")] == 1
    assert (
        counts[tentative("made")] == counts[tentative("confirmed")] + counts[tentative("replaced")]
    )


async def test_a_pod_never_bound_after_scoring_stops_holding_room() -> None:
    """A pod a later plugin rejects at every cycle would otherwise hold room for ever."""
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            await seeded(server, [shared_pod(n, CARD, 100) for n in ("stuck", "next")])
            for _ in range(MAX_MISSES + 1):
                await sched.cycle("stuck", ["node-a"])
            assert ext.view.tentative == {}
            assert (await sched.filter("next", ["node-a"]))["NodeNames"] == ["node-a"]


async def test_a_bind_refused_after_all_is_counted_as_stale() -> None:
    """A bind that finds no room (here: the tentative reservation had expired and another pod
    took the room) is refused with the reason, and counted as a stale filter answer."""
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("node-a", cards=1, memory_mib=CARD))
        async with running_extender(server) as ext, http_session() as http:
            sched = Scheduler(server, ext, http)
            now = [0.0]
            ext.app.inflight.clock = lambda: now[0]
            await seeded(server, [shared_pod(n, CARD, 100) for n in ("late", "other")])
            assert await sched.cycle("late", ["node-a"]) == "node-a"
            now[0] += 3600
            assert await sched.cycle("other", ["node-a"]) == "node-a"
            assert await sched.bind("other", "node-a") == ""
            assert "node-a" in await sched.bind("late", "node-a")
            counts = await sched.metrics()
    assert counts[stale("none")] == 1
