"""Watch streams of the fake API server, consumed by lightkube's async and sync clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx2
import lightkube
import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import ConfigMap, Node, Pod
from lightkube.types import on_error_retry

from kubegpu.testing.apiserver import FakeApiServer, ServerThread, make_node, make_pod
from kubegpu.testing.waiting import wait_until_async


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer(history_size=20) as server:
        yield server


@pytest.fixture
async def client(server: FakeApiServer) -> AsyncIterator[lightkube.AsyncClient]:
    client = server.async_client()
    yield client
    await client.close()


# Bounds every wait for an event, so a missing event fails the test quickly instead of
# hanging until the per-test timeout. Generous: not a performance assertion.
EVENT_WAIT_S = 10.0


async def collect(stream: Any, count: int) -> list[tuple[str, str, str]]:
    """The first ``count`` events as (type, name, resourceVersion)."""
    seen: list[tuple[str, str, str]] = []
    try:
        async with asyncio.timeout(EVENT_WAIT_S):
            async for kind, obj in stream:
                seen.append((kind, obj.metadata.name, obj.metadata.resourceVersion))
                if len(seen) == count:
                    break
    finally:
        await stream.aclose()
    return seen


async def next_event(stream: Any) -> tuple[str, Any]:
    return await asyncio.wait_for(anext(stream), EVENT_WAIT_S)  # type: ignore[no-any-return]


def next_event_sync(stream: Iterator[tuple[str, Any]]) -> tuple[str, Any]:
    """``next(stream)`` with the same bound; the sync watch itself has no read timeout."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(next, stream).result(EVENT_WAIT_S)
    finally:
        # After a timeout the worker stays blocked until the fixture stops the server.
        pool.shutdown(wait=False)


async def raw_watch_lines(server: FakeApiServer, query: str) -> list[dict[str, Any]]:
    """Read a watch response to its end over plain HTTP."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/api/v1/namespaces/default/pods?{query}") as response,
    ):
        assert response.status == 200
        return [json.loads(line) async for line in response.content if line.strip()]


async def test_watch_from_a_version_receives_later_changes_in_order(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    server.store.put("pods", make_pod("before"))
    start = server.store.resource_version
    stream = client.watch(Pod, namespace="default", resource_version=str(start))
    await client.create(Pod.from_dict(make_pod("p1")))
    await client.patch(Pod, "p1", {"metadata": {"labels": {"stage": "two"}}})
    await client.delete(Pod, "p1")
    events = await collect(stream, 3)
    assert [(kind, name) for kind, name, _ in events] == [
        ("ADDED", "p1"),
        ("MODIFIED", "p1"),
        ("DELETED", "p1"),
    ]
    assert [int(rv) for _, _, rv in events] == [start + 1, start + 2, start + 3]


async def test_watch_without_a_version_starts_with_the_current_objects(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    server.store.put("pods", make_pod("a"))
    server.store.put("pods", make_pod("b"))
    stream = client.watch(Pod, namespace="default")
    events = await collect(stream, 2)
    assert [(kind, name) for kind, name, _ in events] == [("ADDED", "a"), ("ADDED", "b")]


async def test_watch_from_an_expired_version_raises_410_expired(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    for i in range(30):  # history_size is 20, so the oldest versions are compacted away
        server.store.put("configmaps", {"metadata": {"name": f"cm-{i}"}})
    stream = client.watch(ConfigMap, namespace="default", resource_version="2")
    with pytest.raises(ApiError) as excinfo:
        await collect(stream, 1)
    assert excinfo.value.status.code == 410
    assert excinfo.value.status.reason == "Expired"
    assert "too old resource version" in excinfo.value.status.message


async def test_on_error_retry_after_410_restarts_from_the_current_state(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    for i in range(30):
        server.store.put("configmaps", {"metadata": {"name": f"cm-{i:02}"}})
    stream = client.watch(
        ConfigMap, namespace="default", resource_version="2", on_error=on_error_retry
    )
    events = await collect(stream, 30)
    assert {kind for kind, _, _ in events} == {"ADDED"}
    assert [name for _, name, _ in events] == [f"cm-{i:02}" for i in range(30)]
    watches = [r for r in server.request_log if r.verb == "watch"]
    assert [r.params.get("resourceVersion") for r in watches] == ["2", None]


async def test_watch_label_selector_reports_objects_leaving_and_entering_the_selection(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    server.store.put("nodes", make_node("n1", labels={"gpu": "yes"}))
    start = server.store.resource_version
    stream = client.watch(Node, labels={"gpu": "yes"}, resource_version=str(start))
    server.store.put("nodes", make_node("other", labels={"gpu": "no"}))
    await client.patch(Node, "n1", {"metadata": {"labels": {"gpu": "no"}}})
    await client.patch(Node, "other", {"metadata": {"labels": {"gpu": "yes"}}})
    events = await collect(stream, 2)
    assert [(kind, name) for kind, name, _ in events] == [("DELETED", "n1"), ("ADDED", "other")]


async def test_watch_field_selector_on_node_name_sees_a_pod_arrive_by_binding(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    server.store.put("pods", make_pod("elsewhere", node_name="node-b"))
    server.store.put("pods", make_pod("p1"))
    stream = client.watch(
        Pod,
        namespace="*",
        fields={"spec.nodeName": "node-a"},
        resource_version=str(server.store.resource_version),
    )
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{server.url}/api/v1/namespaces/default/pods/p1/binding",
            json={
                "kind": "Binding",
                "apiVersion": "v1",
                "metadata": {"name": "p1"},
                "target": {"kind": "Node", "name": "node-a"},
            },
        )
        assert response.status == 201
        assert (await response.json())["status"] == "Success"
    events = await collect(stream, 1)
    assert [(kind, name) for kind, name, _ in events] == [("ADDED", "p1")]


async def test_a_dropped_stream_is_resumed_from_the_last_seen_version(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    start = server.store.resource_version
    stream = client.watch(Pod, namespace="default", resource_version=str(start))
    await client.create(Pod.from_dict(make_pod("p1")))
    first = await next_event(stream)
    assert server.drop_watches() == 1
    await client.create(Pod.from_dict(make_pod("p2")))
    second = await next_event(stream)
    await stream.aclose()
    assert (first[0], first[1].metadata.name) == ("ADDED", "p1")
    assert (second[0], second[1].metadata.name) == ("ADDED", "p2")
    watches = [r for r in server.request_log if r.verb == "watch"]
    assert [r.params.get("resourceVersion") for r in watches] == [
        str(start),
        first[1].metadata.resourceVersion,
    ]


async def test_a_cut_connection_is_an_error_unless_the_client_retries(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    start = str(server.store.resource_version)
    strict = client.watch(Pod, namespace="default", resource_version=start)
    retrying = client.watch(
        Pod, namespace="default", resource_version=start, on_error=on_error_retry
    )
    await client.create(Pod.from_dict(make_pod("p1")))
    assert (await next_event(strict))[1].metadata.name == "p1"
    assert (await next_event(retrying))[1].metadata.name == "p1"
    server.drop_watches(abrupt=True)
    await client.create(Pod.from_dict(make_pod("p2")))
    with pytest.raises(httpx2.TransportError):  # lightkube's HTTP library: the stream broke
        await next_event(strict)
    assert (await next_event(retrying))[1].metadata.name == "p2"
    await strict.aclose()
    await retrying.aclose()


async def test_timeout_seconds_ends_the_stream(server: FakeApiServer) -> None:
    server.store.put("pods", make_pod("p1"))
    lines = await raw_watch_lines(
        server, f"watch=1&timeoutSeconds=1&resourceVersion={server.store.resource_version}"
    )
    assert lines == []
    assert server.store.open_watches == 0


async def test_lightkube_rewatches_when_the_server_timeout_ends_the_stream(
    server: FakeApiServer, client: lightkube.AsyncClient
) -> None:
    stream = client.watch(
        Pod,
        namespace="default",
        server_timeout=1,
        resource_version=str(server.store.resource_version),
    )
    consumer = asyncio.create_task(collect(stream, 1))
    # The first stream ends at its server timeout (one real second: the thing under test),
    # and lightkube opens a second; the server counts requests, it announces none.
    await wait_until_async(
        lambda: server.count("watch", "pods") >= 2,
        timeout_s=10,
        what="a second watch request",
        poll_s=0.05,
    )
    await client.create(Pod.from_dict(make_pod("late")))
    assert [(kind, name) for kind, name, _ in await consumer] == [("ADDED", "late")]


async def bookmarked_watch(
    server: FakeApiServer, timeout_s: int, *, from_now: bool = True
) -> asyncio.Task[list[dict[str, Any]]]:
    """A pods watch asking for bookmarks, open when this returns; the task gives its lines."""
    query = f"watch=true&allowWatchBookmarks=true&timeoutSeconds={timeout_s}"
    if from_now:
        query += f"&resourceVersion={server.store.resource_version}"
    task = asyncio.create_task(raw_watch_lines(server, query))
    await server.wait_for_watches(1)
    return task


async def test_bookmarks_carry_the_current_version_when_asked_for(
    server: FakeApiServer,
) -> None:
    server.store.put("nodes", make_node("n1"))
    task = await bookmarked_watch(server, 1)
    server.store.send_bookmarks()
    lines = await task
    assert lines == [
        {
            "type": "BOOKMARK",
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(server.store.resource_version)},
                # The Pod's zero value, as kube-apiserver writes it (e2e/tests/test_01_watch.py).
                "spec": {"containers": None},
                "status": {},
            },
        }
    ]


async def test_a_bookmark_comes_two_seconds_before_the_timeout_with_the_version_then() -> None:
    # As kube-apiserver's watch cache does: the client re-opening at the timeout resumes from
    # the newest version, not from the one it opened at. The minute's bookmark is far off.
    async with FakeApiServer(bookmark_interval_s=60.0) as server:
        server.store.put("pods", make_pod("a"))
        task = await bookmarked_watch(server, 3)
        server.store.put("nodes", make_node("n1"))  # moves the version; not this watch's kind
        lines = await task
    assert [line["type"] for line in lines] == ["BOOKMARK"]
    assert lines[0]["object"]["metadata"]["resourceVersion"] == str(server.store.resource_version)


async def test_bookmarks_keep_coming_while_events_flow() -> None:
    async with FakeApiServer(bookmark_interval_s=0.3) as server:
        task = await bookmarked_watch(server, 5, from_now=False)
        for i in range(20):  # an event every 0.1 s: the stream is never idle for an interval
            server.store.put("pods", make_pod(f"p{i}"))
            await asyncio.sleep(0.1)
        lines = await task
    kinds = [line["type"] for line in lines]
    last_event = max(i for i, kind in enumerate(kinds) if kind == "ADDED")
    assert kinds.count("ADDED") == 20
    assert kinds[:last_event].count("BOOKMARK") >= 3


async def test_a_watch_on_a_missing_resource_type_is_not_found(server: FakeApiServer) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{server.url}/api/v1/widgets?watch=1") as response,
    ):
        assert response.status == 404
        body = await response.json()
    assert (body["kind"], body["reason"]) == ("Status", "NotFound")


@pytest.fixture
def thread_server() -> Iterator[ServerThread]:
    with FakeApiServer().run_in_thread() as handle:
        yield handle


def test_sync_client_watch_resumes_after_a_dropped_stream(thread_server: ServerThread) -> None:
    with thread_server.client() as client:
        start = thread_server.store.resource_version
        stream = client.watch(Node, resource_version=str(start))
        client.create(Node.from_dict(make_node("n1")))
        kind, first = next_event_sync(stream)
        thread_server.drop_watches()
        client.patch(Node, "n1", {"metadata": {"labels": {"gpu": "ok"}}})
        client.delete(Node, "n1")
        rest = [next_event_sync(stream), next_event_sync(stream)]
        stream.close()
    assert [(kind, first.metadata.name)] + [(k, o.metadata.name) for k, o in rest] == [
        ("ADDED", "n1"),
        ("MODIFIED", "n1"),
        ("DELETED", "n1"),
    ]
    assert rest[0][1].metadata.labels["gpu"] == "ok"


def test_writes_from_the_test_thread_reach_a_watch_served_on_the_server_thread(
    thread_server: ServerThread,
) -> None:
    with thread_server.client() as client:
        stream = client.watch(Node, resource_version=str(thread_server.store.resource_version))
        thread_server.store.put("nodes", make_node("direct"))
        thread_server.store.remove("nodes", None, "direct")
        events = [next_event_sync(stream), next_event_sync(stream)]
        stream.close()
    assert [(kind, obj.metadata.name) for kind, obj in events] == [
        ("ADDED", "direct"),
        ("DELETED", "direct"),
    ]


async def test_a_watch_whose_client_hung_up_is_unregistered(server: FakeApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        response = await session.get(f"{server.url}/api/v1/pods?watch=1")
        await server.wait_for_watches(1)
        response.close()
    await wait_until_async(
        lambda: not server.store.open_watches, timeout_s=EVENT_WAIT_S, what="no open watch"
    )
    server.store.put("pods", make_pod("after"))  # nothing left to deliver to
