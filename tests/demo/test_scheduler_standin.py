"""The kube-scheduler stand-in against the real extender (HTTP) and the fake API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from kubegpu.testing.apiserver import FakeApiServer, make_pod
from kubegpu.testing.scheduler import (
    DEFAULT_SCHEDULER_NAME,
    Footprint,
    SchedulerSettings,
    SchedulerStandIn,
    fit_reasons,
    pick_node,
    unschedulable_message,
)
from kubegpu.testing.waiting import wait_until_async
from tests.extender.cluster import gpu_node, running_extender, shared_pod, whole_pod


def ours(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulerName"] = DEFAULT_SCHEDULER_NAME
    return pod


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    # The stand-in's verdicts land in the fake API server's store, which announces nothing.
    await wait_until_async(check, timeout_s=timeout_s, what=what, poll_s=0.02)


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as api:
        api.store.put("nodes", gpu_node("node-a", cards=1, cpu="8"))
        api.store.put("nodes", gpu_node("node-b", cards=1, cpu="8"))
        yield api


def stored(server: FakeApiServer, name: str) -> dict[str, Any]:
    pod = server.store.get("pods", "default", name)
    assert pod is not None
    return pod


def refusal(server: FakeApiServer, name: str) -> str | None:
    for c in stored(server, name).get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c["message"])
    return None


async def test_binds_through_the_extender_refuses_with_its_reasons_and_retries_when_a_card_frees(
    server: FakeApiServer,
) -> None:
    async with running_extender(server) as extender:
        client = server.async_client()
        settings = SchedulerSettings(extender.url, retry_interval_s=0.5)
        scheduler = SchedulerStandIn(client, settings)
        task = asyncio.create_task(scheduler.run())
        try:
            for name in ("first", "second"):
                server.store.put("pods", ours(whole_pod(name, 1)))
            await eventually(
                lambda: all(stored(server, n)["spec"].get("nodeName") for n in ("first", "second")),
                "two pods bound",
            )
            assert {stored(server, n)["spec"]["nodeName"] for n in ("first", "second")} == {
                "node-a",
                "node-b",
            }
            server.store.put("pods", ours(whole_pod("third", 1)))
            await eventually(lambda: refusal(server, "third") is not None, "third refused")
            message = refusal(server, "third")
            assert message is not None
            # NodeResourcesFit saw both cards requested before asking the extender.
            assert message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
            # A share passes the node-level fit; the extender's card-level reason is shown.
            server.store.put("pods", ours(shared_pod("huge", 90000, 500)))
            await eventually(lambda: refusal(server, "huge") is not None, "huge refused")
            assert "2 node(s) have no card with 90000 MiB of GPU memory in total" in (
                refusal(server, "huge") or ""
            )
            events = [
                e
                for e in server.store.list("events", "default")
                if e["involvedObject"]["name"] == "third"
            ]
            assert events and events[0]["reason"] == "FailedScheduling"
            assert events[0]["type"] == "Warning"

            freed = stored(server, "first")["spec"]["nodeName"]
            await client.delete(Pod, "first", namespace="default")
            await eventually(
                lambda: stored(server, "third")["spec"].get("nodeName") == freed,
                "third bound to the freed node",
            )
            uid = stored(server, "third")["metadata"]["uid"]
            # The binding lands before the scheduler records its verdict.
            await eventually(
                lambda: scheduler.outcomes[uid].node == freed, "the scheduler's own record"
            )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


async def test_node_resources_fit_runs_before_the_extender_and_other_schedulers_pods_are_left(
    server: FakeApiServer,
) -> None:
    async with running_extender(server) as extender:
        client = server.async_client()
        scheduler = SchedulerStandIn(client, SchedulerSettings(extender.url))
        task = asyncio.create_task(scheduler.run())
        try:
            # CPU only: the extender passes it everywhere; the nodes have 8 CPUs.
            big = ours(make_pod("big", requests={"cpu": "12", "memory": "1Gi"}))
            server.store.put("pods", big)
            server.store.put("pods", whole_pod("foreign", 1))  # default scheduler's pod
            await eventually(lambda: refusal(server, "big") is not None, "big refused")
            assert refusal(server, "big") == "0/2 nodes are available: 2 Insufficient cpu."
            # One more pod of ours, after the foreign one: the stand-in's one watch delivers
            # pods in order and it takes its own first come first served, so once this one
            # has its verdict the foreign pod has been seen (and must have been left alone).
            server.store.put("pods", ours(make_pod("after", requests={"cpu": "1"})))
            await eventually(lambda: bool(stored(server, "after")["spec"].get("nodeName")), "after")
            foreign = stored(server, "foreign")
            assert not foreign["spec"].get("nodeName")
            assert not foreign.get("status", {}).get("conditions")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


def test_unschedulable_message_counts_identical_reasons_like_kube_scheduler() -> None:
    message = unschedulable_message(
        3, {"a": "Insufficient cpu", "b": "Insufficient cpu", "c": "node(s) have no GPU"}
    )
    assert message == "0/3 nodes are available: 1 node(s) have no GPU, 2 Insufficient cpu."
    # kube-scheduler sorts the "count reason" strings as strings, so 12 comes before 2; and it
    # lists every distinct reason.
    reasons = {f"n{i}": "Insufficient cpu" for i in range(12)}
    reasons |= {"m0": "Insufficient memory", "m1": "Insufficient memory"}
    reasons |= {f"x{i}": f"reason {i}" for i in range(10)}
    message = unschedulable_message(24, reasons)
    assert message.startswith("0/24 nodes are available: 1 reason 0, 1 reason 1, ")
    assert message.endswith(", 1 reason 9, 12 Insufficient cpu, 2 Insufficient memory.")


def test_the_best_score_wins_and_ties_go_to_the_smallest_name() -> None:
    assert pick_node({"b": 5, "a": 5, "c": 1}) == "a"
    assert pick_node({"b": 7, "a": 5}) == "b"


def test_fit_counts_bound_pods_against_allocatable() -> None:
    node = gpu_node("n", cards=2, cpu="4")  # allocatable nvidia.com/gpu 2, slots 32
    one_card = Footprint(1000, 1024, {"nvidia.com/gpu": 1})
    assert fit_reasons(one_card, node, [one_card]) == []
    assert fit_reasons(one_card, node, [one_card, one_card]) == ["Insufficient nvidia.com/gpu"]
    assert fit_reasons(Footprint(5000, 0, {}), node, []) == ["Insufficient cpu"]
