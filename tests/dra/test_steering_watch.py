"""Steering from a watch of the claims (issue 27): the pool's allocations kept current by list +
watch over real HTTP, a change of a pool waking that pool's steering and no other, a 410
relisting, every call granted by the driver's RBAC; and the driver re-publishing its slice as
soon as the watch says the pool changed, not an interval later."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kubegpu.core.dra import AllocatedDevice, ClaimRef
from kubegpu.core.dra_ports import FakeResourceSliceSink
from kubegpu.dra.slices import pool_name
from kubegpu.dra.steering import DeviceSteerer
from kubegpu.kube.list_watch import Backoff
from kubegpu.kube.pool_allocations import WatchedPoolAllocations
from kubegpu.testing.apiserver.server import RequestRecord
from kubegpu.testing.waiting import wait_until_async
from tests.deploy.rbac import allowed, rbac_rules
from tests.extender.dra_api import DraApi, serve
from tests.extender.dra_cluster import DRIVER, claim, share_request, share_result, whole_result

from .conftest import NODE, Node, serve_node
from .test_steering import CPU, WORKLOAD, names, shared, two_cards

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 20.0


async def _until(condition: object, what: str) -> None:
    await wait_until_async(condition, timeout_s=WAIT_S, what=what)  # type: ignore[arg-type]


async def test_the_pools_allocations_follow_the_claims_by_watch_and_wake_their_pool() -> None:
    api = DraApi()
    api.put("resourceclaims", claim("a", results=[share_result("n1", 0, "20Gi", "250")]))
    async with serve(api) as client:
        watched = WatchedPoolAllocations(client, DRIVER, backoff=Backoff(0.01, 0.05))
        n1, n2 = watched.changed(pool_name("n1")), watched.changed(pool_name("n2"))
        watched.start()
        try:
            await _until(watched.synced.is_set, "the first list")
            # The list wakes every pool: anything may have changed before it.
            assert n1.is_set() and n2.is_set()
            assert await watched.pool_allocations(DRIVER, pool_name("n1")) == [
                AllocatedDevice("gpu", pool_name("n1"), "gpu-0", "s", 20 * 2**30, 250)
            ]
            n1.clear()
            n2.clear()
            await _until(lambda: len(api.watches) == 1, "the watch")
            lists = len(api.lists)

            # A claim made but not allocated yet changes no pool.
            api.put("resourceclaims", claim("b", [share_request("8Gi", "100")]))
            await _until(lambda: watched.events_seen >= 1, "the claim's event")
            assert not n1.is_set() and not n2.is_set()
            # Allocated on n2: n2 wakes, n1 does not.
            api.put("resourceclaims", claim("b", results=[whole_result("n2", 1)]))
            await _until(n2.is_set, "n2 woken")
            assert not n1.is_set()
            assert await watched.pool_allocations(DRIVER, pool_name("n2")) == [
                AllocatedDevice("gpu", pool_name("n2"), "gpu-1")
            ]
            # Deleted: n1's share is gone, n1 wakes.
            api.delete("resourceclaims", claim("a"))
            await _until(n1.is_set, "n1 woken")
            assert await watched.pool_allocations(DRIVER, pool_name("n1")) == []
            # Answered from memory: no list since the first.
            assert len(api.lists) == lists

            # 410 Gone: listed again, and what changed meanwhile is seen.
            n2.clear()
            api.expire_watches()
            api.delete("resourceclaims", claim("b"))
            await _until(lambda: len(api.lists) > lists and n2.is_set(), "a relist after 410")
            assert await watched.pool_allocations(DRIVER, pool_name("n2")) == []
        finally:
            await watched.close()
    # Every call is one the driver's ClusterRole grants.
    made = [
        RequestRecord(verb, kind, None, None)
        for verb, calls in (("list", api.lists), ("watch", api.watches))
        for kind, _ in calls
    ]
    assert {(r.verb, r.resource) for r in made} == {
        ("list", "resourceclaims"),
        ("watch", "resourceclaims"),
    }
    role = REPO / "deploy" / "components" / "dra-driver" / "dra-driver-rbac.yaml"
    rules = list(rbac_rules(role))
    assert [r for r in made if not allowed(rules, r)] == []
    # The chart's copy of the role grants the same.
    chart = (REPO / "deploy" / "helm" / "kubegpu" / "templates" / "dra-driver.yaml").read_text()
    assert "verbs: [get, list, watch]" in chart


async def test_before_the_first_list_the_watch_says_it_does_not_know() -> None:
    api = DraApi()
    async with serve(api) as client:
        watched = WatchedPoolAllocations(client, DRIVER)
        try:
            await watched.pool_allocations(DRIVER, pool_name("n1"))
        except LookupError as exc:
            assert "not listed" in str(exc)
        else:
            raise AssertionError("answered before listing")


class _WatchedFake:
    """A watch stand-in over the node's fake claims: the test says when the pool changed."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.event = asyncio.Event()
        self.reads = 0

    async def pool_allocations(self, driver: str, pool: str) -> list[AllocatedDevice]:
        self.reads += 1
        return await self.node.claims.pool_allocations(driver, pool)


async def test_the_driver_re_steers_as_soon_as_the_pool_changes_not_an_interval_later(
    node: Node,
) -> None:
    inventory = two_cards()
    sink = FakeResourceSliceSink()
    watched = _WatchedFake(node)
    steerer = DeviceSteerer(inventory, node.settings.driver, NODE, watched, WORKLOAD, CPU)
    # An interval far longer than the test: only the wake can re-steer in time.
    task, stop = await serve_node(
        node,
        sink,
        inventory=inventory,
        steer=steerer.order,
        steer_interval_s=3600,
        steer_wake=watched.event,
    )
    key = (NODE, node.settings.driver)
    try:
        assert names(sink.slices[key]) == ["gpu-0", "gpu-1"]
        node.claims.allocate(ClaimRef("ns", "a", "uid-a"), shared("gpu-0", 32, 400))
        await asyncio.sleep(0.2)
        assert names(sink.slices[key]) == ["gpu-0", "gpu-1"]  # not told: nothing read
        assert watched.reads == 1
        watched.event.set()
        await _until(lambda: names(sink.slices[key]) == ["gpu-1", "gpu-0"], "re-steered")
        assert not watched.event.is_set()  # cleared, so the next change wakes it again
        node.claims.deallocate("uid-a")
        watched.event.set()
        await _until(lambda: names(sink.slices[key]) == ["gpu-0", "gpu-1"], "back")
        assert watched.reads == 3
    finally:
        stop.set()
        assert await task is False
