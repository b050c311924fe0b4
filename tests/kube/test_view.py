"""The cluster view's list + watch against the fake API server: resume after a dropped stream,
relist after 410, stale events ignored, bounded backoff."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from kubegpu.kube.view import Backoff, ClusterView
from kubegpu.sharing.annotations import ALLOCATION_ANNOTATION
from kubegpu.testing.apiserver import FakeApiServer
from tests.extender.cluster import gpu_node, whole_pod


async def eventually(check: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


@contextlib.asynccontextmanager
async def watching(server: FakeApiServer, **kwargs: object) -> AsyncIterator[ClusterView]:
    client = server.async_client()
    view = ClusterView(client, **kwargs)  # type: ignore[arg-type]
    task = asyncio.create_task(view.run())
    try:
        await asyncio.wait_for(view.synced.wait(), 10)
        yield view
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.close()


def bound(name: str, node: str, namespace: str = "default") -> dict[str, object]:
    pod = whole_pod(name, 1, namespace=namespace)
    pod["spec"]["nodeName"] = node  # type: ignore[index]
    return pod


async def test_lists_then_follows_changes_in_every_namespace() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1", cards=2))
        server.store.put("pods", bound("a", "n1"))
        async with watching(server) as view:
            assert set(view.nodes) == {"n1"}
            assert [u.key for u in view.usages_on("n1")] == ["default/a"]
            server.store.put("nodes", gpu_node("n2", cards=4))
            server.store.put("pods", bound("b", "n2", namespace="ml"))  # every namespace
            await eventually(lambda: "n2" in view.nodes and view.usages_on("n2"), "n2 and b seen")
            server.store.remove("pods", "default", "a")
            await eventually(lambda: not view.usages_on("n1"), "a's deletion seen")


async def test_resumes_after_an_abrupt_drop_with_backoff() -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        await asyncio.sleep(0)

    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server, backoff=Backoff(1.0, 4.0), sleep=sleep) as view:
            relists = view.relists
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            server.drop_watches(abrupt=True)
            server.store.put("pods", bound("late", "n1"))
            await eventually(lambda: bool(view.usages_on("n1")), "event after the drop seen")
            assert view.relists == relists  # resumed from the version, no relist
    assert delays and all(d == 1.0 for d in delays)  # first retry of each loop: initial delay


def test_backoff_doubles_up_to_its_bound() -> None:
    backoff = Backoff(0.5, 4.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


async def test_relists_when_the_resume_version_has_expired() -> None:
    async with FakeApiServer(history_size=3) as server:
        server.store.put("nodes", gpu_node("n1"))
        server.store.put("pods", bound("a", "n1"))
        async with watching(server, backoff=Backoff(0.01, 0.01)) as view:
            relists = view.relists
            await eventually(lambda: server.store.open_watches == 2, "both watches open")
            # Cut the streams and make history move on past the versions the view holds.
            server.drop_watches(abrupt=True)
            server.store.remove("pods", "default", "a")
            for i in range(10):
                server.store.put("nodes", gpu_node(f"m{i}"))
            await eventually(lambda: view.relists > relists and len(view.nodes) == 11, "relist")
            assert view.usages_on("n1") == []  # the deletion it missed is reflected


async def test_a_stale_event_never_rolls_a_pod_back() -> None:
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        async with watching(server) as view:
            old = server.store.put("pods", bound("a", "n1"))
            await eventually(lambda: bool(view.usages_on("n1")), "pod seen")
            newer = dict(old)
            newer["metadata"] = dict(
                old["metadata"], resourceVersion=str(int(old["metadata"]["resourceVersion"]) + 100)
            )
            newer["status"] = {"phase": "Succeeded"}
            view.apply_pod(newer)  # e.g. our own patch reply, ahead of the watch
            assert view.usages_on("n1") == []
            view.apply_pod(old)  # the watch delivering the older version afterwards
            assert view.usages_on("n1") == []


async def test_malformed_allocation_annotation_is_logged_not_fatal(caplog) -> None:  # type: ignore[no-untyped-def]
    async with FakeApiServer() as server:
        server.store.put("nodes", gpu_node("n1"))
        pod = bound("odd", "n1")
        pod["metadata"]["annotations"] = {ALLOCATION_ANNOTATION: "{not json"}  # type: ignore[index]
        server.store.put("pods", pod)
        async with watching(server) as view:
            usage = view.usages_on("n1")
    assert [u.cards for u in usage] == [()]
    assert "annotation kubegpu.io/gpu-allocation: not JSON" in caplog.text
